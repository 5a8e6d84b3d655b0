/* The public scalar codecs: thin exported wrappers over the inline definitions in formats.h / bf16.h. */
#include "core/formats.h"

uint16_t k3_bf16_from_f32(float x) { return k3_f32_to_bf16_bits(x); }
float k3_bf16_to_f32(uint16_t b) { return k3_bf16_bits_to_f32(b); }
uint8_t k3_e4m3_from_f32(float x) { return k3_e4m3_encode(x); }
float k3_e4m3_to_f32(uint8_t c) { return k3_e4m3_decode(c); }
uint8_t k3_e2m1_from_f32(float x) { return k3_e2m1_encode(x); }
float k3_e2m1_to_f32(uint8_t c) { return k3_e2m1_decode(c); }
float k3_ue8m0_to_f32(uint8_t c) { return k3_ue8m0_decode(c); }
