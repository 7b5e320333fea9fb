// Rotary angles without floating-point range reduction.
//
// The CPU reference computes theta = pos * base^(-2i/d) in double precision, because float angles
// lose the low bits that distinguish neighbouring positions once positions reach the thousands.
// GPUs may not have doubles, and GLSL's sin/cos are only specified to about 2^-11 absolute error.
// Instead, the host gives each pair i the frequency as a 64-bit fixed-point fraction of a turn,
// G_i = frac(base^(-2i/d) / 2pi) * 2^64, so pos * G_i mod 2^64 is the angle in turns, computed
// exactly with integer arithmetic for any position (negative too: the rotations that re-rotate
// rolled keys). The top three bits select the octant, the rest is the angle inside it (as accurate
// as a float can hold it), and short minimax polynomials on [0, pi/4] (those of the Cephes library)
// give sin and cos to about one ulp.

// Angle of `pos` times the frequency `turn_fraction` (low word, high word) as (cos, sin).
vec2 rotary_cos_sin(int pos, uvec2 turn_fraction) {
    const uint pos_lo = uint(pos), pos_hi = pos < 0 ? 0xFFFFFFFFu : 0u;
    uint prod_hi, prod_lo;
    umulExtended(pos_lo, turn_fraction.x, prod_hi, prod_lo);
    const uint turns_hi = prod_hi + pos_lo * turn_fraction.y + pos_hi * turn_fraction.x;  // mod 2^32
    const uint turns_lo = prod_lo;

    const uint octant = turns_hi >> 29;
    const uint inside = (turns_hi << 3) | (turns_lo >> 29);  // 32-bit fraction of the octant
    // In odd octants measure from the octant's end, so the polynomial argument stays in [0, pi/4].
    float fraction;
    if ((octant & 1u) == 0u) {
        fraction = float(inside) * (1.0 / 4294967296.0);
    } else {
        fraction = inside == 0u ? 1.0 : float(0u - inside) * (1.0 / 4294967296.0);
    }
    const float x = fraction * 0.78539816339744830962;  // pi / 4
    const float z = x * x;
    const float s = ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * x + x;
    const float c = ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z - 0.5 * z + 1.0;
    // Angle inside the quadrant: x (even octant) or pi/2 - x (odd octant).
    float sin_q = s, cos_q = c;
    if ((octant & 1u) != 0u) {
        sin_q = c;
        cos_q = s;
    }
    switch (octant >> 1) {  // quadrant: add k * pi/2
        case 0u: return vec2(cos_q, sin_q);
        case 1u: return vec2(-sin_q, cos_q);
        case 2u: return vec2(-cos_q, -sin_q);
        default: return vec2(sin_q, -cos_q);
    }
}

// Rotates the pair (a, b) by the angle given as (cos, sin), exactly as the CPU reference does.
vec2 rotate_pair(vec2 ab, vec2 cs) {
    return vec2(ab.x * cs.x - ab.y * cs.y, ab.x * cs.y + ab.y * cs.x);
}

// The elements of rotary pair i of a head, as offsets from the head's first (rotary.h's
// RotaryPairing): adjacent (2i, 2i + 1), or halves (i, i + pairs).
const uint PAIRING_ADJACENT = 0u, PAIRING_HALVES = 1u;
uvec2 rotary_pair_elements(uint pairing, uint i, uint pairs) {
    return pairing == PAIRING_HALVES ? uvec2(i, i + pairs) : uvec2(2u * i, 2u * i + 1u);
}
