# SPDX-License-Identifier: Apache-2.0
"""The one thing pyproject.toml cannot say: the C scan of vLLM's stream lines is optional.

Without a compiler (or Python headers) the build warns and goes on; `engines/vllm_stream.py` then uses its regex,
which gives the same rows, only slower. Everything else about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "nemo_polar.proxy.engines._sse_scan",
            ["nemo_polar/proxy/engines/_sse_scan.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
