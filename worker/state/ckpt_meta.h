/* ckpt_meta.h - what a checkpoint file says it holds: its tensors' kinds and its model
 * (ckpt_meta.c). Below both ckpt.c (save, resume) and ckpt_set.c (the pieces), which read them. */
#ifndef CEPHALO_CKPT_META_H
#define CEPHALO_CKPT_META_H

#include "common/err.h"
#include "formats/safetensors.h"
#include "planner/model.h"

/* A checkpoint's tensors are "KIND.UNIT" (UNIT: model_unit_name) for these kinds: the
 * parameters and the two AdamW moments, each unit's flat buffer (or a rank's slice of it). */
extern const char *const CKPT_KINDS[3];

/* trainer_resume, ckpt_check_model: -1: the checkpoint cannot be read or is damaged;
 * RESUME_OTHER_MODEL (-2): it is sound but of another model (the message names both). */
#define RESUME_OTHER_MODEL (-2)

/* The model spec a checkpoint (or dump) carries in its "cephalo.model" metadata, validated. */
int ckpt_read_model(const st_file *f, model_spec *m, err_t *err);
/* 0 when the checkpoint (or dump) file f holds model `want`, else RESUME_OTHER_MODEL with a
 * message naming both models (or -1 when f has no readable model). */
int ckpt_check_model(const st_file *f, const model_spec *want, err_t *err);

#endif
