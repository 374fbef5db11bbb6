/* fuzz_safetensors.c — libFuzzer target for the safetensors header parser
 * (zt_st_parse_buffer: length prefix, strict JSON, offset validation). The
 * input is a whole file image; a successful parse must describe tensors that lie
 * inside the data section, which is asserted so that a validation gap is a crash. */
#include <stdint.h>
#include <stdlib.h>

#include "zt_common.h"
#include "zt_safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    zt_st_file_t f;
    char err[ZT_ERRLEN];
    if (zt_st_parse_buffer("fuzz.safetensors", data, size, &f, err, sizeof err) == 0) {
        for (int i = 0; i < f.ntensors; i++)
            if (f.tensors[i].end > f.data_len || f.tensors[i].end < f.tensors[i].begin) abort();
        zt_st_close(&f);
    }
    return 0;
}
