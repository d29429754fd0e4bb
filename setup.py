# SPDX-License-Identifier: Apache-2.0
"""The one thing pyproject.toml cannot say: the C extensions are optional.

Without a compiler (or Python headers) the build warns and goes on, and each user of a module falls back to its pure
Python code, which gives the same results, only slower: `engines/vllm_stream.py` to its regex for the C scan of
vLLM's stream lines and `engines/vllm.py` to the full parse of a whole answer (`_sse_scan`); `proxy/store.py` and
`engines/base.py` to `struct`, `types.py` to numpy, for the token-id checks and compact array encodings (`_arrays`);
`proxy/tuning.py` leaves CPython's arenas where they are (`_hugemem`). Everything else about the package is in
pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "nemo_polar.proxy.engines._sse_scan",
            ["nemo_polar/proxy/engines/_sse_scan.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
        Extension("nemo_polar._arrays", ["nemo_polar/_arrays.c"], optional=True, extra_compile_args=["-O2"]),
        Extension("nemo_polar._hugemem", ["nemo_polar/_hugemem.c"], optional=True, extra_compile_args=["-O2"]),
    ]
)
