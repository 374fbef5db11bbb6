/* fuzz_ckpt_meta.c — libFuzzer target for the checkpoint metadata reader.
 * The input is handed to HDF5 as an in-memory file image (core driver) and goes
 * through zt_ckpt_check_image: root/optimizer/data attributes, the /model tensor
 * listing, shape and dtype checks, checksum attributes and a small read of each
 * tensor. libhdf5 itself is not instrumented, so coverage guidance comes from
 * ztrain's code; crashes inside libhdf5 on malformed files are HDF5 bugs. */
#include <stdint.h>
#include <stdlib.h>

#include "zt_ckpt.h"
#include "zt_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[ZT_ERRLEN];
    if (size == 0) return 0;
    zt_ckpt_check_image(data, size, err, sizeof err);
    return 0;
}
