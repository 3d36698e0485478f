"""Fits the two polynomials of oxgen's f32 erf (crates/kernels/src/erf.rs) and prints them
as Rust constants, highest degree first, rounded to f32.

  small: erf(x) / x - 1 as a polynomial of degree 8 in u = x^2 on 0 <= x <= 1.25
         (relative error weights), so erf(x) = x + x q(u) keeps the leading x exact;
  large: ln erfc(x) as a polynomial of degree 6 in t = x - 2.5 on 1.25 <= x <= 4
         (weighted by erfc(x): the absolute error of 1 - e^r).

Each is a near-minimax fit: least squares on 400-600 Chebyshev nodes, reweighted by
Lawson's rule toward equal peak errors, in f64 from 40-digit values of erf. Needs numpy
and mpmath (`python -m pip install numpy mpmath`); run `python erf_fit.py`.
"""

import mpmath as mp
import numpy as np

mp.mp.dps = 40
SPLIT, CLAMP, MID = 1.25, 4.0, 2.5
SMALL_DEGREE, LARGE_DEGREE = 8, 6


def chebyshev(a, b, n):
    k = np.arange(n)
    nodes = (a + b) / 2 + (b - a) / 2 * np.cos(np.pi * (2 * k + 1) / (2 * n))
    return np.concatenate([nodes, [a, b]])


def lawson(xs, values, weights, basis, rounds=60):
    """Coefficients (lowest degree first) minimizing max |weight (p - value)|."""
    a = np.array([basis(x) for x in xs])
    f = np.array([float(v) for v in values])
    w = np.array([float(v) for v in weights])
    lam = np.full(len(xs), 1.0 / len(xs))
    for _ in range(rounds):
        sw = np.sqrt(lam) * w
        c, *_ = np.linalg.lstsq(a * sw[:, None], f * sw, rcond=None)
        err = np.abs((a @ c - f) * w)
        lam = lam * err / np.sum(lam * err)
    return c, err.max()


def small():
    us = chebyshev(0.0, SPLIT * SPLIT, 400)
    ratio = [mp.erf(mp.sqrt(u)) / mp.sqrt(u) if u > 0 else 2 / mp.sqrt(mp.pi) for u in us]
    c, err = lawson(us, [r - 1 for r in ratio], [1 / r for r in ratio],
                    lambda u: [u**j for j in range(SMALL_DEGREE + 1)])
    return c, err


def large():
    xs = chebyshev(SPLIT, CLAMP, 600)
    c, err = lawson(xs, [mp.log(mp.erfc(x)) for x in xs], [mp.erfc(x) for x in xs],
                    lambda x: [(x - MID) ** j for j in range(LARGE_DEGREE + 1)])
    return c, err


def rust(name, coefficients, what):
    print(f"/// {what}, highest degree first.")
    print(f"const {name}: [f32; {len(coefficients)}] = [")
    for v in coefficients[::-1]:
        print(f"    {str(np.float32(v))},")
    print("];")


if __name__ == "__main__":
    (cs, es), (cl, el) = small(), large()
    rust("SMALL", cs, f"`q(u)`, relative error {es:.1e} of erf(x)/x before rounding")
    rust("LARGE", cl, f"`r(t)`, error {el:.1e} of erf before rounding")
