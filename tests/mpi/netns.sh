# netns.sh — two hosts on one machine for multi-host runs (sourced; POSIX sh).
#
# netns_up DIR       two network namespaces (the hosts, $ZT_HOST_A and $ZT_HOST_B, each
#                    with the address 10.213.0.1 or .2 on its interface zt0) joined by a
#                    bridge in a third namespace; writes DIR/netns-hosts (the hostfile)
#                    and DIR/netns-agent.sh (Open MPI's launcher into a host: it runs the
#                    daemon's command in that host's network namespace under its own
#                    hostname, a UTS namespace, as ssh would). Returns 1 with the reason
#                    in $ZT_NETNS_WHY (and nothing left behind) where namespaces cannot
#                    be made: not root, no ip(8) or unshare(1), a kernel without veth or
#                    bridges.
# netns_rate RATE    a token bucket (tc tbf) of RATE (e.g. 1gbit) on both hosts' egress
# netns_run NP cmd   mpirun -hostfile from host A: NP ranks, $ZT_NETNS_SLOTS (default 2)
#                    a host, filled in order; TCP between the hosts, shared memory within
# netns_ztrain NP args   ztrain through netns_run; output in $ZT_OUT (printed), status returned
# netns_down         removes the namespaces (their interfaces go with them)
# The host names are those of the ranks' hosts, so MPI_COMM_TYPE_SHARED, ztrain's node
# count and Open MPI's per-host temporary directories see two nodes.

netns_up() {
    ZT_NETNS_DIR=$1
    ZT_NS="ztmh-$$"
    ZT_HOST_A="$ZT_NS-a"
    ZT_HOST_B="$ZT_NS-b"
    if [ "$(id -u)" -ne 0 ]; then
        ZT_NETNS_WHY="network namespaces need root (CI runs the suite as root)"
        return 1
    fi
    for tool in ip unshare mpirun; do
        command -v $tool >/dev/null 2>&1 || { ZT_NETNS_WHY="$tool not found"; return 1; }
    done
    if ! ip netns add "$ZT_NS-s" 2>/dev/null; then
        ZT_NETNS_WHY="ip netns add failed (no CAP_SYS_ADMIN / CAP_NET_ADMIN here)"
        return 1
    fi
    ZT_NETNS_MADE=1
    i=1
    for h in a b; do
        ip netns add "$ZT_NS-$h" &&
            ip -n "$ZT_NS-$h" link set lo up &&
            ip -n "$ZT_NS-s" link add "p$h" type veth peer name zt0 netns "$ZT_NS-$h" &&
            ip -n "$ZT_NS-$h" addr add "10.213.0.$i/24" dev zt0 &&
            ip -n "$ZT_NS-$h" link set zt0 up || {
            ZT_NETNS_WHY="cannot make host $h's namespace and its veth pair"
            netns_down
            return 1
        }
        i=$((i + 1))
    done
    ip -n "$ZT_NS-s" link add br0 type bridge && ip -n "$ZT_NS-s" link set br0 up &&
        ip -n "$ZT_NS-s" link set pa master br0 up && ip -n "$ZT_NS-s" link set pb master br0 up || {
        ZT_NETNS_WHY="cannot make the bridge"
        netns_down
        return 1
    }
    printf '%s slots=%s\n%s slots=%s\n' "$ZT_HOST_A" "${ZT_NETNS_SLOTS:-2}" "$ZT_HOST_B" "${ZT_NETNS_SLOTS:-2}" \
        >"$ZT_NETNS_DIR/netns-hosts"
    cat >"$ZT_NETNS_DIR/netns-agent.sh" <<EOF
#!/bin/sh
# Open MPI's rsh agent: HOST COMMAND... runs COMMAND (a shell command line) on HOST
host=\$1
shift
case \$host in
$ZT_HOST_A) ns=$ZT_NS-a ;;
$ZT_HOST_B) ns=$ZT_NS-b ;;
*) echo "netns-agent.sh: no host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$host && \$*"
EOF
    chmod +x "$ZT_NETNS_DIR/netns-agent.sh"
}

netns_rate() {
    for h in a b; do
        ip netns exec "$ZT_NS-$h" tc qdisc replace dev zt0 root tbf rate "$1" burst 256kb latency 50ms || return 1
    done
}

netns_down() {
    [ "${ZT_NETNS_MADE:-0}" = 1 ] || return 0
    for h in a b s; do ip netns del "$ZT_NS-$h" 2>/dev/null; done
    ZT_NETNS_MADE=0
}

netns_run() {
    np=$1
    shift
    printf '%s slots=%s\n%s slots=%s\n' "$ZT_HOST_A" "${ZT_NETNS_SLOTS:-2}" "$ZT_HOST_B" "${ZT_NETNS_SLOTS:-2}" \
        >"$ZT_NETNS_DIR/netns-hosts"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_base_warn_component_unused=0 \
        OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} \
        timeout -k 10 "${ZT_TEST_TIMEOUT:-300}" ip netns exec "$ZT_NS-a" unshare --uts sh -c \
        'hostname "$0" && exec "$@"' "$ZT_HOST_A" \
        mpirun --hostfile "$ZT_NETNS_DIR/netns-hosts" --mca plm_rsh_agent "$ZT_NETNS_DIR/netns-agent.sh" \
        --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none \
        --mca btl_tcp_if_include zt0 --mca oob_tcp_if_include zt0 --bind-to none --mca mpi_yield_when_idle 1 \
        -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -np "$np" "$@"
}

netns_ztrain() {
    np=$1
    shift
    echo "+ netns_run $np ztrain $*"
    netns_run "$np" "$ZTRAIN" "$@" >"$ZT_OUT" 2>&1
    ZT_RC=$?
    cat "$ZT_OUT"
    return $ZT_RC
}
