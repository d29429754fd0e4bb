# SPDX-License-Identifier: Apache-2.0
"""`install()`: make NeMo RL's GRPO estimator factory able to select CALL-CREDIT from YAML, and prove it did.

NeMo RL has no estimator registry: `nemo_rl.algorithms.grpo._create_advantage_estimator(master_config)` is a
closed if/elif on `grpo.adv_estimator.name`, looked up through the module global by both trainers (pinned
commit). `install()` replaces that global with a wrapper that

- builds the class named by `grpo.adv_estimator._target_` (the forward-compatible YAML: `name: grpo` plus
  `_target_: nemo_polar.credit.nemo_rl.CallCreditAdvantageEstimator`), or ours for `name: call_credit` (valid
  where NeMo RL's `name` is a plain `str`, as at the pinned commit);
- hands everything else to the original factory;
- fills `call_credit.tokenizer` from `policy.tokenizer.name` when unset (the decode route's default);
- logs and prints the class actually chosen and raises `PluginNotLoadedError` if it is not the one asked for;
- makes the synchronous trainers log the estimator's `last_metrics` (`sync_metrics.py`; async GRPO does it itself).

Does: patch one module attribute (idempotent, reversible with `uninstall()`). Does not: import `nemo_rl` at
module level; the target module is imported when `install()` runs (or passed in, e.g. a stand-in in tests).
"""

from __future__ import annotations

import copy
import logging
import typing
from collections.abc import Callable
from types import ModuleType
from typing import Any

from nemo_polar.errors import PolarError
from nemo_polar.loading import load_object

from . import sync_metrics, training_state
from .options import ESTIMATOR_NAME, ESTIMATOR_TARGET, as_plain, get_key
from .pinned import FACTORY_NAME, GRPO_MODULE
from .wrapping import resolve_module, unwrap, wrap

log = logging.getLogger(__name__)

_WRAPPED_FLAG = "__call_credit_wrapped__"


class PluginNotLoadedError(PolarError, RuntimeError):
    """The config asks for a plug-in estimator but NeMo RL built another one (plain GRPO would run silently)."""


def import_target(dotted: str) -> Any:
    """The object at `package.module.Name` (or `package.module:Name`); `LoadError` names the path on failure."""
    return load_object(dotted, what="_target_")


def requested_target(adv_config: Any) -> str | None:
    """The estimator class path a config asks for: its `_target_`, ours for `name: call_credit`, else None."""
    target = get_key(adv_config, "_target_")
    if target:
        return str(target)
    if get_key(adv_config, "name") == ESTIMATOR_NAME:
        return ESTIMATOR_TARGET
    return None


def class_path(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _public_path(path: str) -> str:
    # our class is defined in .estimator but exported (and named in YAML) from the package
    return ESTIMATOR_TARGET if path == "nemo_polar.credit.nemo_rl.estimator.CallCreditAdvantageEstimator" else path


def check_chosen(estimator: Any, adv_config: Any) -> str:
    """The chosen class path; raises `PluginNotLoadedError` if the config asked for a different class."""
    chosen = _public_path(class_path(estimator))
    wanted = requested_target(adv_config)
    if wanted is not None and chosen != _public_path(wanted):
        raise PluginNotLoadedError(
            f"grpo.adv_estimator asks for {wanted} but NeMo RL built {chosen}: the CALL-CREDIT plug-in is not "
            "installed in this process (launch with `python -m nemo_polar.credit.nemo_rl.launch`)"
        )
    return chosen


def allows_name_call_credit(grpo_module: ModuleType | str | None = None) -> bool:
    """Whether this NeMo RL's config model accepts `grpo.adv_estimator.name: call_credit` (a `str`, not a Literal)."""
    module = resolve_module(grpo_module, GRPO_MODULE)
    model = getattr(module, "AdvEstimatorConfig", None)
    if model is None:
        grpo_config = getattr(module, "GRPOConfig", None)
        field = getattr(grpo_config, "model_fields", {}).get("adv_estimator")
        model = getattr(field, "annotation", None)
    field = getattr(model, "model_fields", {}).get("name")
    if field is None:
        return True  # a dict config (NeMo RL v0.6/0.7): nothing validates the name before the factory
    annotation = field.annotation
    if typing.get_origin(annotation) is typing.Literal:
        return ESTIMATOR_NAME in typing.get_args(annotation)
    return annotation is str


def _with_tokenizer(adv_config: Any, master_config: Any) -> dict[str, Any]:
    config = copy.deepcopy(as_plain(adv_config)) or {}
    block = config.setdefault("call_credit", {}) or {}
    config["call_credit"] = block
    if not block.get("tokenizer"):
        tokenizer = get_key(get_key(master_config, "policy"), "tokenizer")
        name = get_key(tokenizer, "name") or get_key(get_key(master_config, "policy"), "model_name")
        if name:
            block["tokenizer"] = str(name)
    return config


def _factory_wrapper(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def create_advantage_estimator(master_config: Any) -> Any:
        adv_config = get_key(get_key(master_config, "grpo"), "adv_estimator")
        target = requested_target(adv_config)
        if target is None:
            estimator = original(master_config)
        else:
            cls = import_target(target)
            # ours gets a plain dict with the policy tokenizer filled in; another plug-in gets NeMo RL's object as is
            ours = _public_path(class_path(cls)) == ESTIMATOR_TARGET
            config = _with_tokenizer(adv_config, master_config) if ours else adv_config
            estimator = cls(config, get_key(master_config, "loss_fn"))
        chosen = check_chosen(estimator, adv_config)
        message = f"  ✓ advantage estimator class: {chosen}"
        print(message, flush=True)
        log.info(message.strip())
        create_advantage_estimator.last_chosen = chosen  # type: ignore[attr-defined]
        sync_metrics.track(estimator)  # its last_metrics reach the synchronous trainers' logged metrics
        training_state.check_master_config(estimator, master_config)  # IG damping must reach the loss
        training_state.restore(estimator)  # ω co-evolution state from the checkpoint NeMo RL resumed from, if any
        return estimator

    create_advantage_estimator.last_chosen = None  # type: ignore[attr-defined]
    return create_advantage_estimator


def install(grpo_module: ModuleType | str | None = None) -> Callable[[Any], Any]:
    """Wrap `<grpo_module>._create_advantage_estimator` (default: NeMo RL's) so YAML can select CALL-CREDIT.

    Returns:
        The wrapper now installed (calling `install()` again returns the same wrapper).
    """
    module = resolve_module(grpo_module, GRPO_MODULE)
    current = getattr(module, FACTORY_NAME)
    wrapper = wrap(module, FACTORY_NAME, _factory_wrapper, _WRAPPED_FLAG)
    if wrapper is current:
        return wrapper  # already installed
    sync_metrics.install_sync_metrics(module)
    training_state.install_checkpoint_hooks()  # the estimator's state is written into every checkpoint
    log.info("CALL-CREDIT: wrapped %s.%s", module.__name__, FACTORY_NAME)
    return wrapper


def uninstall(grpo_module: ModuleType | str | None = None) -> None:
    """Put the original factory back (no-op when not installed)."""
    module = resolve_module(grpo_module, GRPO_MODULE)
    unwrap(module, FACTORY_NAME, _WRAPPED_FLAG)
    sync_metrics.uninstall_sync_metrics(module)
    training_state.uninstall_checkpoint_hooks()
