# SPDX-License-Identifier: Apache-2.0
"""`polar_lab`: test and benchmark code that is not part of the shipped `nemo_polar` wheel.

Experiments and fakes live here (e.g. `polar_lab.credit_sim`, the credit-fidelity simulator); tests and
benchmarks import them from the repository root. Nothing under `nemo_polar/` may import this package.
"""
