// HF MXFP4 tensors -> kaon's MXFP4 layout, one tensor (a Linear or stacked experts) at a time.
#include "model/mxfp4_weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/mxfp4.h"
#include "model/model.h"
#include "util/err.h"

static int find_suffixed(const kaon_model *m, const char *name, const char *suffix, kaon_tensor *t) {
    char full[320];
    snprintf(full, sizeof full, "%s%s", name, suffix);
    return kaon_model_find_tensor(m, full, t);
}

int kaon_mxfp4_probe(const kaon_model *m, const char *name, kaon_tensor *out) {
    if (kaon_model_find_tensor(m, name, out)) return -1;
    if (out->data || m->gguf || m->quant.format != KAON_QFMT_MXFP4) return 0;
    return find_suffixed(m, name, "_blocks", out);
}

int kaon_mxfp4_load(kaon_model *m, const char *name, kaon_tensor *out) {
    memset(out, 0, sizeof *out);
    if (m->gguf || m->quant.format != KAON_QFMT_MXFP4) return 0;
    kaon_tensor b, s;
    if (find_suffixed(m, name, "_blocks", &b)) return -1;
    if (!b.data) return 0;
    if (find_suffixed(m, name, "_scales", &s)) return -1;
    if (!s.data) return kaon_set_error("%s: MXFP4 tensor '%s_blocks' has no '%s_scales'", m->path, name, name);
    // The module: a Linear's name without ".weight"; stacked experts' own name.
    char module[320];
    const size_t n = strlen(name);
    snprintf(module, sizeof module, "%.*s", (int)(n > 7 && !strcmp(name + n - 7, ".weight") ? n - 7 : n), name);
    if (!kaon_quant_module_quantized(&m->quant, module))
        return kaon_set_error("%s: '%s' is stored as MXFP4, but modules_to_not_convert leaves it unquantized", m->path,
                              module);
    bool ok = b.dtype == KAON_U8 && s.dtype == KAON_U8 && b.ndim >= 3 && b.ndim <= KAON_MAX_DIMS + 1 &&
              s.ndim == b.ndim - 1 && b.shape[b.ndim - 1] == 16;
    for (int i = 0; ok && i < s.ndim; i++) ok = s.shape[i] == b.shape[i];
    if (!ok)
        return kaon_set_error("%s: MXFP4 tensor '%s': _blocks must be U8 [..., rows, cols / 32, 16] and _scales U8 "
                              "[..., rows, cols / 32] (got %s rank %d, %s rank %d)", m->path, name,
                              kaon_dtype_name(b.dtype), b.ndim, kaon_dtype_name(s.dtype), s.ndim);
    const int64_t nblocks = kaon_tensor_numel(&s);
    if (b.nbytes < (size_t)nblocks * 16 || s.nbytes < (size_t)nblocks)
        return kaon_set_error("%s: MXFP4 tensor '%s': data is short", m->path, name);
    uint8_t *dst = malloc((size_t)nblocks * KAON_MXFP4_BLOCK_BYTES + 1);
    if (!dst) return kaon_set_error("out of memory");
    if (kaon_model_own(m, dst)) return -1;
    kaon_mxfp4_from_hf(b.data, s.data, nblocks, dst);
    out->dtype = KAON_MXFP4;
    out->ndim = s.ndim;
    for (int i = 0; i < s.ndim; i++) out->shape[i] = s.shape[i];
    out->shape[s.ndim - 1] *= KAON_MXFP4_BLOCK;
    out->data = dst;
    out->nbytes = (size_t)nblocks * KAON_MXFP4_BLOCK_BYTES;
    return 0;
}
