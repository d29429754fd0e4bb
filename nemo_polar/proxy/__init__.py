# SPDX-License-Identifier: Apache-2.0
"""nemo_polar.proxy: the model-API proxy (DESIGN §2–§3, §8).

Where things live:
    app.py           aiohttp server: dialect routing, session auth, plans, sampling enforcement, durable replies,
                     admin API; `Proxy` / `ProxyConfig` (Python API) and `run()`
    cli.py           `polar proxy --upstream URL [--upstream URL …] --port P --store DIR`
    sessions.py      sessions, per-session keys, plans, classifiers
    store.py         SQLite-WAL record store with batched durable commits
    engines/         vLLM and SGLang engines; sticky routing and failover (`engines/base.py`)
    upstream_http.py the lean keep-alive HTTP/1.1 client the engines talk to the inference servers with
    plans.py         forced / replayed plan steps; Hermes tool-call rendering and parsing
    prefix.py        prefix-preserving generation against stock vLLM (splicing the chain tip)
    normalized.py    the dialect/engine contract (ChatRequest, ChatResult, StreamEvent, ProviderError)
    dialects/        one module per provider dialect
    fake_upstream.py a FAKE vLLM/SGLang server for tests and the overhead benchmark

This package's `__init__` imports nothing, so dialects and types stay importable without the server's dependencies.
"""
