// The constants of the vector exponentials (simd_avx512.h, simd_avx2.h), in one place for both
// ISAs. Polynomial coefficients go highest degree first, for Horner's rule.
#pragma once

namespace mammoth::kernels::cpu {

inline constexpr float kLog2e = 1.44269504088896341f;
// ln 2 in two parts (Cody-Waite): kLn2Hi has 9 significant bits, so n * kLn2Hi is exact for the
// |n| <= 150 used here, and the reduced r = x - n ln2 is exact to ~2^-35.
inline constexpr float kLn2Hi = 0.693359375f;
inline constexpr float kLn2Lo = -2.12194440e-4f;
// e^r on |r| <= ln2/2: degree-6 minimax, its own error ~2e-9.
inline constexpr float kExpPoly[] = {1.3843653723597527e-3f,
                                     8.37415549904108e-3f,
                                     4.166800156235695e-2f,
                                     1.6666431725025177e-1f,
                                     4.999999403953552e-1f,
                                     1.0f,
                                     1.0f};
// 2^f on [0, 1): degree-5 near-minimax, 2.4 * 2^-24 relative in f32, exactly 1 at f = 0.
inline constexpr float kExp2FracPoly[] = {1.8671316793188453e-3f, 9.017026983201504e-3f,
                                          5.579991638660431e-2f,  2.4016444385051727e-1f,
                                          6.931512951850891e-1f,  1.0f};

}  // namespace mammoth::kernels::cpu
