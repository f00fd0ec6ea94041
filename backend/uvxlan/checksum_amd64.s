#include "textflag.h"

// func sum32AVX2(b []byte) uint64
//
// Returns the sum of the little-endian 32-bit words of b, as a 64-bit
// integer. len(b) must be a non-zero multiple of 128. Each 64-bit lane
// adds the low and the high 32-bit half of its word into two accumulators,
// four pairs of them, so no carry is ever lost (a lane would need 2^32
// adds to overflow).
TEXT ·sum32AVX2(SB), NOSPLIT, $0-32
	MOVQ b_base+0(FP), SI
	MOVQ b_len+8(FP), CX
	VPXOR Y0, Y0, Y0
	VPXOR Y1, Y1, Y1
	VPXOR Y2, Y2, Y2
	VPXOR Y3, Y3, Y3
	VPCMPEQD Y15, Y15, Y15
	VPSRLQ $32, Y15, Y15 // 0x00000000ffffffff in every lane

loop:
	VMOVDQU 0(SI), Y4
	VMOVDQU 32(SI), Y5
	VMOVDQU 64(SI), Y6
	VMOVDQU 96(SI), Y7
	VPAND Y15, Y4, Y8
	VPSRLQ $32, Y4, Y4
	VPAND Y15, Y5, Y9
	VPSRLQ $32, Y5, Y5
	VPAND Y15, Y6, Y10
	VPSRLQ $32, Y6, Y6
	VPAND Y15, Y7, Y11
	VPSRLQ $32, Y7, Y7
	VPADDQ Y8, Y0, Y0
	VPADDQ Y4, Y1, Y1
	VPADDQ Y9, Y2, Y2
	VPADDQ Y5, Y3, Y3
	VPADDQ Y10, Y0, Y0
	VPADDQ Y6, Y1, Y1
	VPADDQ Y11, Y2, Y2
	VPADDQ Y7, Y3, Y3
	ADDQ $128, SI
	SUBQ $128, CX
	JNZ  loop

	VPADDQ Y1, Y0, Y0
	VPADDQ Y3, Y2, Y2
	VPADDQ Y2, Y0, Y0
	VEXTRACTI128 $1, Y0, X1
	VPADDQ X1, X0, X0
	VPSHUFD $0x4e, X0, X1
	VPADDQ X1, X0, X0
	VMOVQ X0, AX
	VZEROUPPER
	MOVQ AX, ret+24(FP)
	RET
