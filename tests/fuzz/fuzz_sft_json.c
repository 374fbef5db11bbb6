/* fuzz_sft_json.c — libFuzzer target for zt_sft_index, the byte scan that splits a JSON
 * array of SFT records so ranks can parse shares of it (src/zt_sft_json.c).
 *
 * Differential against jansson parsing the whole text, which is what zt_sft_parse did
 * before the scan: for a text whose first non-blank byte is '[' that jansson accepts, the
 * scan must accept it with as many records as the array's elements, each record's bytes
 * parsing alone to the very element (json_equal); for one jansson rejects, zt_sft_parse
 * (the scan, then each element alone) must fail with jansson's own message. JSON Lines
 * texts are only run (no crash, records in order). Any disagreement aborts. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zt_common.h"
#include "zt_sft.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    char err[ZT_ERRLEN];
    zt_sft_index_t ix;
    const int rc = zt_sft_index("f.json", text, size, &ix, err, sizeof err);
    size_t p = 0;
    while (p < size && (text[p] == ' ' || text[p] == '\t' || text[p] == '\n' || text[p] == '\r')) p++;
    if (p < size && text[p] == '[') {
        json_error_t je;
        json_t *root = json_loadb(text, size, 0, &je);
        if (!root) {
            /* the scan may pass a text whose elements jansson then rejects one by one: the
             * parse must still fail first with jansson's message for the whole */
            char want[ZT_ERRLEN];
            snprintf(want, sizeof want, "f.json:%d:%d: not JSON: %s", je.line, je.column, je.text);
            zt_sft_records_t r;
            if (zt_sft_parse("f.json", text, size, ZT_SFT_ALPACA, &r, err, sizeof err) == 0 || strcmp(err, want)) {
                fprintf(stderr, "zt_sft_parse: '%s' where jansson says '%s'\n", err, want);
                abort();
            }
        } else {
            const size_t n = json_array_size(root);
            if (n == 0 ? rc == 0 || !strstr(err, "no records") : rc != 0 || ix.n != n || !ix.array) {
                fprintf(stderr, "jansson: %zu elements; scan rc %d, %zu records: %s\n", n, rc, rc ? 0 : ix.n,
                        rc ? err : "");
                abort();
            }
            for (size_t i = 0; rc == 0 && i < n; i++) {
                json_t *e = json_loadb(text + ix.off[i], ix.len[i], JSON_DECODE_ANY, &je);
                if (!e || !json_equal(e, json_array_get(root, i))) {
                    fprintf(stderr, "record %zu: its bytes are not element %zu\n", i, i);
                    abort();
                }
                json_decref(e);
            }
            json_decref(root);
        }
    } else if (rc == 0) {
        for (size_t i = 1; i < ix.n; i++)
            if (ix.line[i] <= ix.line[i - 1] || ix.off[i] < ix.off[i - 1] + ix.len[i - 1]) abort();
    }
    if (rc == 0) zt_sft_index_free(&ix);
    return 0;
}
