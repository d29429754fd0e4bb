# SPDX-License-Identifier: Apache-2.0
"""nemo_polar.proxy: the model-API proxy (docs/architecture.md; records and plans: docs/contracts.md).

Where things live:
    app.py           the HTTP surface: routes (through the dialect registry), session auth, error mapping, the flow of
                     one harness call; `Proxy` (Python API), `ProxyConfig` (re-exported from config.py), `run()`
    config.py        `ProxyConfig`
    admin.py         the admin API (sessions, records, pause/resume, policy version, status) and the admission gate
    generation.py    one strategy per plan-step kind (live, forced, replay, next-best) and prefix preservation
    streaming.py     the SSE reply: batched writes, the record committed before the terminal event
    recording.py     how a call becomes a CompletionRecord (opened once, completed or failed once)
    cli.py           `polar proxy --upstream URL [--upstream URL …] --port P --store DIR`
    sessions.py      sessions, per-session keys, plans, classifiers
    store.py         SQLite-WAL record store with batched durable commits
    engines/         the `Engine` protocol (`engines/base.py`: sticky routing, failover), vLLM and SGLang engines
    upstream_http.py the lean keep-alive HTTP/1.1 client the engines talk to the inference servers with
    plans.py         forced / replayed plan steps; Hermes tool-call rendering and parsing
    prefix.py        prefix-preserving generation against stock vLLM (splicing the chain tip)
    normalized.py    the dialect/engine contract (ChatRequest, ChatResult, StreamEvent, ProviderError)
    dialects/        one module per provider dialect, and the one registry that maps a request to its dialect

The FAKE vLLM/SGLang server for tests and benchmarks is `polar_lab.fake_upstream` (not shipped).
This package's `__init__` imports nothing, so dialects and types stay importable without the server's dependencies.
"""
