/* A safetensors tensor of F32, BF16 or F16 read as floats: what `train --init` accepts, the
 * half-precision ones widened exactly (every bf16 and fp16 value is an fp32 value). */
#include <string.h>

#include "meshtrain/half.h"
#include "trainer_internal.h"

/* Half-precision elements widened a block at a time: the file's bytes need not be aligned. */
static void widen(mt_half_format format, const unsigned char *bytes, uint64_t count, float *out)
{
    enum { BLOCK = 1024 };
    mt_half block[BLOCK];
    for (uint64_t done = 0; done < count;) {
        size_t n = count - done < BLOCK ? (size_t)(count - done) : BLOCK;
        for (size_t k = 0; k < n; k++) /* little-endian in the file, on any host */
            block[k] = (mt_half)(bytes[2 * (done + k)] | bytes[2 * (done + k) + 1] << 8);
        mt_half_to_f32(format, out + done, block, n);
        done += n;
    }
}

int trainer_safetensors_is_float(mt_safetensors_dtype dtype)
{
    return dtype == MT_SAFETENSORS_F32 || dtype == MT_SAFETENSORS_BF16 ||
           dtype == MT_SAFETENSORS_F16;
}

mt_status trainer_safetensors_read_floats(const mt_safetensors *file, int i, float *out)
{
    const mt_safetensors_tensor *t = mt_safetensors_tensor_at(file, i);
    if (t && (t->dtype == MT_SAFETENSORS_BF16 || t->dtype == MT_SAFETENSORS_F16)) {
        widen(t->dtype == MT_SAFETENSORS_BF16 ? MT_HALF_BF16 : MT_HALF_F16, t->data, t->numel,
              out);
        return MT_OK;
    }
    if (t && t->dtype != MT_SAFETENSORS_F32)
        return mt_fail(MT_EFORMAT, "'%s': tensor '%s' is %s; parameters are read from F32, "
                                   "BF16 or F16", mt_safetensors_path(file), t->name,
                       mt_safetensors_dtype_name(t->dtype));
    return mt_safetensors_read_f32(file, i, out);
}
