/* torchbin.h - reading the tensors of a PyTorch state dict saved by torch.save (pytorch_model.bin,
 * docs/import.md), without running any of it.
 *
 * The file is torch.save's zip archive (PyTorch >= 1.6): "<archive>/data.pkl", a pickle of the
 * state dict whose tensors name their storages by persistent id, the storages' raw bytes as
 * "<archive>/data/<key>" (stored, not compressed), and optionally "<archive>/byteorder". The
 * pickle is read by a small interpreter of the opcodes torch.save emits for a state dict and of
 * nothing else: the only callables it knows are collections.OrderedDict,
 * torch._utils._rebuild_tensor_v2, torch._utils._rebuild_parameter and the typed storages
 * (torch.FloatStorage, ...), and it calls none of them, it records what they would build. Any
 * other global or opcode is an error naming the file, the opcode or global, and its byte in
 * data.pkl; every length, index and offset is checked against the bytes there are, so a corrupt
 * or truncated file is an error too.
 *
 * The result is an st_file (formats/safetensors.h), so a loader reads it as a safetensors file:
 * contiguous tensors point into the mapped file, a strided one (e.g. a transposed view that was
 * saved) is copied out once, in row-major order. */
#ifndef CEPHALO_TORCHBIN_H
#define CEPHALO_TORCHBIN_H

#include <stddef.h>

#include "common/err.h"
#include "formats/safetensors.h"

/* Maps `path` and reads its state dict (tb_parse); the st_file owns the mapping. */
int tb_open(st_file **out, const char *path, err_t *err);
/* The same from a buffer, which must outlive the st_file; `label` names it in messages. */
int tb_parse(st_file **out, const void *buf, size_t len, const char *label, err_t *err);

#endif
