/* Pointer alignment tests for the run calls: the CPU backend reads and writes tensors as their element types,
 * so a pointer that is not aligned to its element would be undefined behaviour; runs refuse it instead. */
#ifndef K3_API_PTR_ALIGN_H
#define K3_API_PTR_ALIGN_H

#include <stddef.h>
#include <stdint.h>

/* 1 when p is NULL or a multiple of `align` bytes (a power of two). */
static inline int k3_aligned(const void *p, size_t align) { return ((uintptr_t)p & (uintptr_t)(align - 1)) == 0; }

#endif
