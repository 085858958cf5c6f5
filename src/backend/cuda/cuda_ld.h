// The PTX form of weight loads issued before a kernel's PDL wait (kc_pdl_wait; cuda_internal.h's
// ld_stream_early). Not .nc: ptxas treats .nc loads as free to sink below the wait, and did (the
// SASS of k_gemv's MINB 1 forms -- batch 1's o_proj and down --, k_gemv_silu<7|8, 1>,
// k_gemv_qkv_rope and k_moe_route_small had no weight load before it, so each waited a full
// memory round trip after the kernel before ended); a coherent load stays where the source puts
// it. Built with -DKAON_WEIGHT_LOADS_NC=1: the .nc form (an A/B build).
#ifndef KAON_BACKEND_CUDA_LD_H
#define KAON_BACKEND_CUDA_LD_H

#if KAON_WEIGHT_LOADS_NC
#define KC_LD_EARLY "ld.global.nc.L1::no_allocate"
#else
#define KC_LD_EARLY "ld.global.L1::no_allocate"
#endif

#endif
