"""Linear layers that read one input, fused into one GEMM (the `compile_fuse_linears` key).

Every attention of both encoders projects its input three times (q, k and v: three GEMMs of
hidden x hidden). At the model's shapes a hidden x hidden GEMM reaches about 0.43 of an H200's
bf16 peak against about 0.57 for the FFN's hidden x 4 hidden (benchmarks/results/
mfu_levers_1xh200/gemm_ceiling.md); one GEMM of hidden x 3 hidden on the weights concatenated
does the same multiply-adds in the wider shape, and its backward likewise (the input gradient
one GEMM with K = 3 hidden, the weight gradient one GEMM, split back to the three weights).

This is an Inductor pre-grad pass (``torch._inductor.config.pre_grad_custom_pass``): it works
on the graph dynamo traced, so it fuses wherever a compiled region holds such linears (each
layer of `compile_scope: layers`, or the whole model) and changes neither the modules nor
their parameter names (checkpoints load either way). Inductor's own ``batch_linear_lhs`` does
the same for 2-D inputs only; a transformer's activations are 3-D. The pass has a ``uuid``, so
Inductor's FX-graph cache keys compiled code by it and reuses it across processes.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

__all__ = ["FuseSharedInputLinears", "set_linear_fusion"]

_LINEAR = (torch._C._nn.linear, torch.nn.functional.linear)


class FuseSharedInputLinears(CustomGraphPass):
    """Replace the linears of one graph that read the same input node (all with a bias, or
    all without) by one linear on their weights (and biases) concatenated along the output
    features, and a split of its output. ``fused``: how many groups the last call fused."""

    fused = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        nodes_in_order = list(graph.nodes)
        order = {node: i for i, node in enumerate(nodes_in_order)}
        groups: dict[tuple[Any, bool], list[torch.fx.Node]] = defaultdict(list)
        for node in graph.nodes:
            parts = _linear_parts(node)
            if parts is not None:
                source, _, bias = parts
                groups[(source, bias is None)].append(node)
        self.fused = 0
        for nodes in groups.values():
            if (
                len(nodes) > 1
                and _fusable(nodes, order)
                and _nothing_between(nodes, order, nodes_in_order)
            ):
                _fuse(graph, sorted(nodes, key=order.__getitem__))
                self.fused += 1

    def uuid(self) -> Any:
        return get_hash_for_files((__file__,))


def _linear_parts(node: torch.fx.Node) -> tuple[Any, Any, Any] | None:
    """(input, weight, bias) of a linear call, None for any other node."""
    if node.op != "call_function" or node.target not in _LINEAR:
        return None
    args = list(node.args) + [None] * (3 - len(node.args))
    source = node.kwargs.get("input", args[0])
    weight = node.kwargs.get("weight", args[1])
    bias = node.kwargs.get("bias", args[2])
    return source, weight, bias


def _fusable(nodes: list[torch.fx.Node], order: dict[torch.fx.Node, int]) -> bool:
    """Every weight and bias is a node defined before the first of the linears (so the fused
    one can stand there), of one dtype and one input width."""
    first = min(order[n] for n in nodes)
    weights, biases = [], []
    for node in nodes:
        _, weight, bias = _linear_parts(node)
        for tensor in (weight, bias):
            if tensor is not None and (
                not isinstance(tensor, torch.fx.Node) or order[tensor] >= first
            ):
                return False
        weights.append(_example(weight))
        biases.append(_example(bias) if bias is not None else None)
    if any(w is None or w.dim() != 2 for w in weights):
        return False
    if len({(w.dtype, w.shape[1], w.device) for w in weights}) != 1:
        return False
    return all(b is None or b.dtype == weights[0].dtype for b in biases)


def _nothing_between(
    nodes: list[torch.fx.Node], order: dict[torch.fx.Node, int], in_order: list[torch.fx.Node]
) -> bool:
    """Between the first and the last of the linears, nothing that would make them differ once
    moved to the first one's place: no grad-mode or autocast switch, no in-place op on their
    input (dynamo's graph is not functional; ops named ``..._`` mutate their first argument)."""
    source = _linear_parts(nodes[0])[0]
    first, last = min(order[n] for n in nodes), max(order[n] for n in nodes)
    for node in in_order[first + 1 : last]:
        if node.op not in ("call_function", "call_method"):
            continue
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        if "grad_enabled" in name or "autocast" in name:
            return False
        if name.endswith("_") and not name.endswith("__") and node.args and node.args[0] is source:
            return False
    return True


def _example(node: Any) -> torch.Tensor | None:
    value = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _fuse(graph: torch.fx.Graph, nodes: list[torch.fx.Node]) -> None:
    """``nodes`` in graph order: the fused linear stands before the first."""
    parts = [_linear_parts(n) for n in nodes]
    source = parts[0][0]
    sizes = [_example(weight).shape[0] for _, weight, _ in parts]
    with graph.inserting_before(nodes[0]):
        weight = graph.call_function(torch.cat, ([w for _, w, _ in parts],), {"dim": 0})
        bias = None
        if parts[0][2] is not None:
            bias = graph.call_function(torch.cat, ([b for _, _, b in parts],), {"dim": 0})
        fused = graph.call_function(torch._C._nn.linear, (source, weight, bias))
        pieces = graph.call_function(torch.split, (fused, sizes), {"dim": -1})
        outputs = [graph.call_function(operator.getitem, (pieces, i)) for i in range(len(nodes))]
    for node, output in zip(nodes, outputs, strict=True):
        output.meta.update(node.meta)
        node.replace_all_uses_with(output)
        graph.erase_node(node)


_PASS = FuseSharedInputLinears()


def set_linear_fusion(on: bool) -> None:
    """Install the pass in Inductor's config for this process's next compiles, or take it out
    (set per run: a resident worker serves runs with and without it). A pre-grad custom pass
    someone else installed is left alone when ``on`` is false."""
    import torch._inductor.config as inductor_config

    if on:
        inductor_config.pre_grad_custom_pass = _PASS
    elif inductor_config.pre_grad_custom_pass is _PASS:
        inductor_config.pre_grad_custom_pass = None
