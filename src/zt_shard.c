/* zt_shard.c — being written */
