"""The vLLM verdict, computed in a child interpreter (`python -m
inspector._internal.load.engine_child`): vLLM's own model class built on the meta device from
config.json, its own `load_weights` fed the stored names, shapes and dtypes as meta tensors.

A child, because vLLM's import is most of the cost and its code runs on an untrusted config:
the process is sealed (`load.seal`), capped and ended by its parent (SECURITY.md, 1b). The
steps, and what is added to vLLM's own check: docs/architecture.md, "load/".
"""

from __future__ import annotations

import inspect
import os
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from typing import IO, Any

import orjson

# Lists in the answer keep at most this many names (each a count too).
ANSWER_NAMES = 200
_MESSAGE = 2_000
# The largest JSON file copied for vLLM (a config.json is kilobytes).
_JSON_CAP = 64 << 20


def _verdict(path: str, layout: str, tp: int) -> dict[str, Any]:
    from inspector._internal.load.child import verdict_digest
    from inspector._internal.load.seal import sealed
    from inspector._internal.scan.entry import scan

    scanned = scan(path, layout=layout)
    digest = verdict_digest(scanned)
    stored = _stored(scanned)
    with sealed() as seal:
        # vLLM keeps what it learns of a model class in its cache folder: this request's
        # private folder, the one place the seal lets it write.
        os.environ["VLLM_CACHE_ROOT"] = seal.folder
        try:
            model = _private_copy(path, scanned, seal.folder)
            answer = _load(model, stored, tp, seal.folder)
        except Exception as exc:  # vLLM could not build the model: say why, no finding
            needed = seal.needed(exc)
            reason = f"needs {needed}" if needed else _text(exc)
            answer = {"skipped": f"vLLM could not build the model: {reason}"}
    answer["digest"] = digest
    return answer


def _private_copy(path: str, scanned: Any, folder: str) -> str:
    """A folder vLLM may read: config.json as the scan parsed it, within the load check's
    bounds and without any `auto_map` (`load.verdict.bounded_config`), and the other JSON
    files the scan found (the quantization and generation configs), each opened as a regular
    file inside the checkpoint folder and capped, copied into the sealed private folder. vLLM
    never opens the checkpoint folder: a link there to /dev/zero or to a file elsewhere, a
    `.py` file, a file changed meanwhile or a tokenizer file are not its input."""
    from inspector._internal.common.filenames import CONFIG_NAME, INDEX_NAME
    from inspector._internal.load.verdict import bounded_config
    from inspector._internal.storage.local import LocalStorage

    storage = LocalStorage(path)
    model = os.path.join(folder, "model")
    os.mkdir(model)
    with open(os.path.join(model, CONFIG_NAME), "xb") as out:
        out.write(orjson.dumps(bounded_config(scanned.config)))
    # The names come from the scan's fixed list of file names, never from the folder.
    for name in sorted(scanned.json_files - {INDEX_NAME, CONFIG_NAME}):
        data = storage.read_bytes(name, cap=_JSON_CAP)
        with open(os.path.join(model, os.path.basename(name)), "xb") as out:
            out.write(data)
    return model


def _reset(parallel_state: Any) -> None:
    """No distributed groups left: the next model gets groups made for its own config (a
    MoE config's expert-parallel group exists only when made for one)."""
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.destroy_distributed_environment()


def _stored(scanned: Any) -> list[tuple[str, str, tuple[int, ...]]]:
    t = scanned.tensors
    return [
        (str(n), str(d), tuple(int(x) for x in s))
        for n, d, s in zip(
            t["name"].tolist(), t["dtype"].tolist(), t["shape"].tolist(), strict=True
        )
    ]


def _load(
    path: str, stored: list[tuple[str, str, tuple[int, ...]]], tp: int, folder: str
) -> dict[str, Any]:
    import torch
    import vllm
    from vllm.config import (
        DeviceConfig,
        LoadConfig,
        ModelConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.distributed import parallel_state
    from vllm.model_executor.model_loader.utils import initialize_model

    started = time.monotonic()
    model_config = ModelConfig(
        model=path, skip_tokenizer_init=True, enforce_eager=True, trust_remote_code=False
    )
    config = VllmConfig(
        model_config=model_config,
        load_config=LoadConfig(load_format="dummy"),
        device_config=DeviceConfig("cpu"),
    )
    _reset(parallel_state)
    with ExitStack() as stack:
        stack.enter_context(set_current_vllm_config(config))
        stack.callback(_reset, parallel_state)
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                distributed_init_method=f"file://{os.path.join(folder, 'gloo')}",
                backend="gloo",
            )
            parallel_state.ensure_model_parallel_initialized(1, 1)
        group = parallel_state.get_tp_group()
        group.world_size = tp  # rank 0 of `tp`: the layers read it while they are built
        with torch.device("meta"):
            model = initialize_model(config)
        calls = _wrap_loaders(model)
        weights = ((name, _meta(torch, dtype, shape)) for name, dtype, shape in stored)
        error = None
        returned: set[str] | None = None
        try:
            loaded = model.load_weights(weights)
            returned = set(loaded) if loaded is not None else None
        except Exception as exc:
            error = exc
        answer: dict[str, Any] = {
            "engine": "vllm",
            "version": vllm.__version__,
            "architecture": type(model).__name__,
            "tp": tp,
            "quantization": model_config.quantization,
        }
        if error is not None:
            answer["error"] = _text(error)
            answer["error_kind"] = _kind(error)
        else:
            answer.update(_judge(model, returned, calls, tp))
        answer["seconds"] = round(time.monotonic() - started, 3)
        return answer


def _meta(torch: Any, dtype: str, shape: tuple[int, ...]) -> Any:
    from inspector._internal.load.verdict import torch_dtype

    return torch.empty(shape, dtype=torch_dtype(dtype), device="meta")


def _wrap_loaders(model: Any) -> dict[str, list[tuple[Any, Any, int]]]:
    """Record every call of every parameter's weight loader: (shard id, expert id, elements
    received), by parameter name."""
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    calls: dict[str, list[tuple[Any, Any, int]]] = {}
    for name, param in model.named_parameters():
        try:
            original = param.weight_loader
        except AttributeError:
            original = default_weight_loader
        calls[name] = []
        param.weight_loader = _recording(original, calls[name])
    return calls


def _recording(
    original: Callable[..., Any], into: list[tuple[Any, Any, int]]
) -> Callable[..., Any]:
    try:
        signature: inspect.Signature | None = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None

    def loader(*args: Any, **kwargs: Any) -> Any:
        # Called positionally by most layers, with keywords by FusedMoE's callers.
        bound: dict[str, Any] = {}
        if signature is not None:
            try:
                bound = dict(signature.bind_partial(*args, **kwargs).arguments)
            except TypeError:
                bound = {}
        loaded = bound.get("loaded_weight", args[1] if len(args) > 1 else None)
        shard = bound.get("shard_id", bound.get("loaded_shard_id"))
        expert = bound.get("expert_id")
        numel = getattr(loaded, "numel", None)
        elements = int(numel()) if callable(numel) else 0
        result = original(*args, **kwargs)
        # FusedMoE's `return_success`: an expert another rank holds is not received here.
        if result is not False:
            into.append((_plain(shard), _plain(expert), elements))
        return result

    return loader


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, tuple):
        return list(value)
    return str(value)


def _judge(
    model: Any, returned: set[str] | None, calls: dict[str, list], tp: int
) -> dict[str, Any]:
    from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod
    from vllm.model_executor.model_loader import default_loader

    # vLLM's own list of parameters a quantization config builds (a module-private name).
    config_built = getattr(default_loader, "_CONFIG_BUILT_PARAMS", ("input_scale_ub",))

    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    exempt: set[str] = set()
    for module_name, module in modules.items():
        method = getattr(module, "quant_method", None)
        online = getattr(method, "uses_meta_device", False)
        for param_name, param in module.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            if (
                online
                or isinstance(method, BaseKVCacheMethod)
                or param.numel() == 0
                or param_name.rsplit(".", 1)[-1] in config_built
            ):
                exempt.add(full)
    if returned is None:
        # A model whose load_weights returns nothing: what a weight loader received counts.
        returned = {n for n, c in calls.items() if c}
    missing = sorted(n for n in params if n not in returned and n not in exempt)
    shards: list[list[str]] = []
    sizes: list[list[Any]] = []
    for name, param in params.items():
        got = calls.get(name, [])
        if not got or name in exempt:
            continue
        module = modules.get(name.rpartition(".")[0])
        lacking = _shards_lacking(name, module, got)
        if lacking:
            shards.append([name, ", ".join(lacking[:8]) + (" ..." if len(lacking) > 8 else "")])
        elif tp == 1 and name.endswith("weight") and param.dtype.is_floating_point:
            expected = _elements(param, module)
            received = sum(c[2] for c in got)
            if received != expected:
                sizes.append([name, received, expected, list(param.shape)])
    return {
        "missing": missing[:ANSWER_NAMES],
        "missing_count": len(missing),
        "missing_shards": shards[:ANSWER_NAMES],
        "missing_shards_count": len(shards),
        "size_mismatched": sizes[:ANSWER_NAMES],
        "size_mismatched_count": len(sizes),
        "parameters": len(params),
    }


def _shards_lacking(name: str, module: Any, got: list[tuple[Any, Any, int]]) -> list[str]:
    """Shard ids of a fused (q/k/v, gate/up) or stacked (experts) parameter that no call
    filled; none when a call loaded the whole parameter (a shard id of None)."""
    received = {(c[0] if not isinstance(c[0], list) else tuple(c[0]), c[1]) for c in got}
    if any(shard is None and expert is None for shard, expert in received):
        return []
    experts = getattr(module, "local_num_experts", None)
    if any(expert is not None for _, expert in received) and isinstance(experts, int):
        leaf = name.rpartition(".")[2]
        parts = ("w1", "w3") if leaf.startswith("w13") else ("w2",) if leaf.startswith("w2") else ()
        want = [(p, e) for e in range(experts) for p in parts]
        lost = [(p, e) for p, e in want if (p, e) not in received]
        return [f"expert {e} {p}" for p, e in lost]
    kind = type(module).__name__ if module is not None else ""
    shard_ids = {s for s, _ in received}
    if kind == "QKVParallelLinear":
        return [s for s in ("q", "k", "v") if s not in shard_ids]
    sizes = getattr(module, "output_sizes", None)
    if isinstance(sizes, list) and len(sizes) > 1 and all(isinstance(s, int) for s in shard_ids):
        return [str(i) for i in range(len(sizes)) if i not in shard_ids]
    return []


def _elements(param: Any, module: Any) -> int:
    """What the stored tensors must add up to at TP 1: the parameter, except a vocabulary
    padded to 64 rows (`VocabParallelEmbedding`), where only the real rows are stored."""
    rows = getattr(module, "org_vocab_size", None)
    dim = getattr(module, "embedding_dim", None)
    if isinstance(rows, int) and isinstance(dim, int) and param.dim() == 2:
        return rows * dim
    return int(param.numel())


def _kind(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, KeyError) or "no module or parameter named" in text:
        return "unmapped"
    if "size" in text.lower() or "shape" in text.lower() or "narrow" in text:
        return "shape"
    return "other"


def _text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _MESSAGE else text[: _MESSAGE - 3] + "..."


def _serve(requests: IO[bytes], answers: IO[bytes]) -> None:
    """Answer each request line with one answer line, until the requests end."""
    for line in requests:
        try:
            request = orjson.loads(line)
            answer = _verdict(str(request["path"]), str(request["layout"]), int(request["tp"]))
        except Exception:
            answer = {"failed": traceback.format_exc(limit=20)[-_MESSAGE:]}
        answers.write(orjson.dumps(answer) + b"\n")
        answers.flush()


def _bound() -> None:
    """Before any request: a lower CPU priority (as the load check's child) and an address
    space of `ENGINE_MEMORY`, so that a config.json declaring a billion layers ends this
    process, not the machine's memory (the parent's deadline bounds its time)."""
    import resource

    from inspector._internal.load.engine import ENGINE_MEMORY

    if hasattr(os, "nice"):
        os.nice(5)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = ENGINE_MEMORY if hard == resource.RLIM_INFINITY else min(ENGINE_MEMORY, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _prepare() -> None:
    """Once, before any request and outside the seal: what vLLM does on its own first use
    that the seal refuses, done here with vLLM's own code (installed, not the checkpoint's).
    Importing it imports urllib3, which probes for IPv6 by binding a socket to ::1, and later
    cpuinfo, which runs `file` on the interpreter (`platform.architecture`); and vLLM
    inspects a model class in a subprocess with a temporary folder, to keep CUDA out of its
    own process (`_LazyRegisteredModel.inspect_model_cls`): a CPU child has no CUDA to keep
    out, so the inspection runs in this process."""
    import cpuinfo  # type: ignore[import-untyped]  # noqa: F401  (runs `file` when imported)
    from vllm.config import VllmConfig  # noqa: F401  (vLLM's imports, urllib3's among them)
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()


def _main() -> None:
    # The answers go to the pipe the parent reads; what vLLM prints goes to stderr.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    requests = os.fdopen(os.dup(0), "rb")
    _bound()
    _prepare()
    _serve(requests, answers)
    answers.close()
    # vLLM's atexit handlers and gloo's threads are not waited for.
    os._exit(0)


if __name__ == "__main__":
    _main()
