"""How many parameters a checkpoint stores: one count, one rule, used everywhere.

The count is of **values**: a packed 4-bit weight counts the values it holds, not its bytes
(Model-Optimizer NVFP4 stores two E2M1 codes per U8 element, compressed-tensors packs eight
4-bit values into an I32), and what is not a parameter is left out: quantization scales
(`weight_scale`, `input_scale`, ..., MXFP4 `*_scales`) and the persistent buffers known by
name (`e_score_correction_bias`, ...). That is what the model built from config.json counts
(`num_parameters()`, what transformers writes as `total_parameters`), so the scan, the
reports, the load check and every index this project writes give one number for one
checkpoint (`PARAMETER_RULE` says how, wherever the number is shown).

A weight is taken as packed 4-bit when its module says so: a Model-Optimizer NVFP4 module
stores `weight_scale_2`, a compressed-tensors NVFP4 one `weight_global_scale`; a
`weight_packed` holds the quantization config's `num_bits` per value (4 when it does not
say; only with a compressed-tensors config); MXFP4 `*_blocks` (gpt-oss) hold two values a
byte. Column-wise: no Python loop over
the tensors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from inspector.dtypes import DTYPE_BITS
from inspector.naming_rules import BUFFER_PARAMS, QUANT_SIBLING_PARAMS

__all__ = ["PARAMETER_RULE", "count_parameters", "parameters_of"]

PARAMETER_RULE = "values; packed 4-bit weights unpacked; quantization scales and buffers left out"

# Integer dtypes 4-bit values are packed into.
_PACKED_INTO = frozenset({"U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64"})
# A module storing one of these holds FP4 (NVFP4) values in its integer weight.
_FP4_EVIDENCE = frozenset({"weight_scale_2", "weight_global_scale"})
_BLOCKS, _SCALES = "_blocks", "_scales"
# A hostile shape may multiply past what int64 holds; no real tensor comes near this.
_NUMEL_CAP = 2**62


def count_parameters(
    tensors: pd.DataFrame,
    *,
    config: Mapping[str, Any] | None = None,
) -> int:
    """The parameters (values, see the module docstring) of a tensors table: each name once;
    columns `name`, `dtype`, `numel`. `config` is config.json: a compressed-tensors
    `quantization_config` says how many bits a `weight_packed` value has (without one, a
    `weight_packed` is counted as stored)."""
    if not len(tensors):
        return 0
    tensors = tensors.drop_duplicates("name") if tensors["name"].duplicated().any() else tensors
    # The full module of each name (the tables' `module` column is a template across
    # layers and experts): evidence of packing is per module.
    split = [str(n).rpartition(".") for n in tensors["name"].tolist()]
    module = np.array([m for m, _, _ in split], dtype=object)
    param = np.array([p for _, _, p in split], dtype=object)
    dtype = tensors["dtype"].astype(str).to_numpy(dtype=object)
    numel = tensors["numel"].to_numpy(dtype=np.int64)
    return int(_values(module, param, dtype, numel, _packed_bits(config)).sum())


def parameters_of(
    names: Sequence[str],
    dtypes: Sequence[str],
    shapes: Sequence[Sequence[int]],
    *,
    config: Mapping[str, Any] | None = None,
) -> int:
    """`count_parameters` of tensors given as names, dtypes and shapes (a plan's output)."""
    numel = [min(math.prod(s), _NUMEL_CAP) for s in shapes]
    frame = pd.DataFrame({"name": list(names), "dtype": list(dtypes), "numel": numel})
    return count_parameters(frame, config=config)


def _values(
    module: np.ndarray, param: np.ndarray, dtype: np.ndarray, numel: np.ndarray, bits: int
) -> np.ndarray:
    """Values per tensor: 0 for scales and buffers, numel x values per element for packed
    4-bit weights, numel otherwise."""
    params = pd.Series(param, dtype=object)
    not_counted = params.isin(QUANT_SIBLING_PARAMS | BUFFER_PARAMS).to_numpy(dtype=bool, copy=True)
    blocks = params.str.endswith(_BLOCKS).to_numpy(dtype=bool)
    scales = params.str.endswith(_SCALES).to_numpy(dtype=bool)
    if scales.any() and blocks.any():
        # MXFP4: `<proj>_scales` next to `<proj>_blocks` in the same module.
        stems = {
            (m, p[: -len(_BLOCKS)]) for m, p in zip(module[blocks], param[blocks], strict=True)
        }
        for row in np.flatnonzero(scales).tolist():
            if (module[row], param[row][: -len(_SCALES)]) in stems:
                not_counted[row] = True
    integer = pd.Series(dtype, dtype=object).isin(_PACKED_INTO).to_numpy(dtype=bool)
    fp4_modules = set(module[params.isin(_FP4_EVIDENCE).to_numpy(dtype=bool)].tolist())
    weight = (params == "weight").to_numpy(dtype=bool)
    packed_weight = (params == "weight_packed").to_numpy(dtype=bool)
    in_fp4 = pd.Series(module, dtype=object).isin(fp4_modules).to_numpy(dtype=bool)
    element_bits = np.array([DTYPE_BITS.get(d, 8) for d in dtype.tolist()], dtype=np.int64)
    values_per = np.ones(len(numel), dtype=np.int64)
    fp4 = integer & (weight | packed_weight) & in_fp4
    values_per[fp4] = element_bits[fp4] // 4
    if bits:
        packed = integer & packed_weight & ~in_fp4
        values_per[packed] = np.maximum(element_bits[packed] // bits, 1)
    mx = integer & blocks
    values_per[mx] = element_bits[mx] // 4
    out = numel * values_per
    out[not_counted] = 0
    return out


def _packed_bits(config: Mapping[str, Any] | None) -> int:
    """compressed-tensors' bits per packed weight value: the config's one `num_bits` (4 when
    it names none or several); 0 without a compressed-tensors config."""
    qc = config.get("quantization_config") if isinstance(config, Mapping) else None
    if not isinstance(qc, Mapping) or qc.get("quant_method") != "compressed-tensors":
        return 0
    groups = qc.get("config_groups") if isinstance(qc, Mapping) else None
    found = set()
    if isinstance(groups, Mapping):
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            bits = weights.get("num_bits") if isinstance(weights, Mapping) else None
            if isinstance(bits, int) and not isinstance(bits, bool) and 0 < bits <= 64:
                found.add(bits)
    return found.pop() if len(found) == 1 else 4
