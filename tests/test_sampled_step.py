"""The mini-batch step over padded blocks (dgl_maxk.training.sampled_step).

On the CPU: the padded blocks are valid CSRs within the fan-out, and a model over them
computes, at the real rows, what it computes over the sampler's blocks (forward and
gradients), for the three models, MaxK and ReLU. On a GPU: the graphed step trains as the
eager one does, replays new batches, and still raises on NaN with the weights unchanged.
"""
from __future__ import annotations

import copy
import functools
import math

import pytest
import torch

from dgl_maxk import backends
from dgl_maxk._dgl import dgl
from dgl_maxk.models import build_model
from dgl_maxk.sampling import DeviceGraph, NeighborSampler
from dgl_maxk.training import step as step_module
from dgl_maxk.training.sampled_step import (_MARGIN, PaddedBatch, SampledStep, _bounds,
                                            seen_sizes)
from conftest import ReadsOnTheHost, optimizer_state

needs_kernels = pytest.mark.skipif(not backends.cuda.available(),
                                   reason="no CUDA GPU with CuPy (a CUDA graph of the kernels)")


def _graph(n):
    """A random graph with hubs (in-degree far above the fan-outs) and nodes without
    in-edges."""
    src = torch.randint(0, n, (6 * n,))
    dst = torch.randint(0, n, (6 * n,))
    hubs = torch.randint(0, n, (4,))
    src = torch.cat([src, torch.randint(0, n, (8 * n,))])
    dst = torch.cat([dst, hubs[torch.randint(0, 4, (8 * n,))]])
    empty = torch.randperm(n)[:n // 10]
    keep = ~torch.isin(dst, empty)
    return dgl.graph((src[keep], dst[keep]), num_nodes=n)


def _regular_graph(n, degree):
    """Every node ``degree`` in-edges from random sources: batches of it have nearly the
    same sizes (each row exactly its fan-out's edges, where degree >= fan-out)."""
    src = torch.randint(0, n, (n * degree,))
    return dgl.graph((src, torch.arange(n).repeat(degree)), num_nodes=n)


def _batch(graph, fanouts, batch_size, device="cpu", dtype=torch.float64, width=6):
    dg = DeviceGraph.from_dgl(graph, device)
    seeds = torch.randperm(graph.num_nodes())[:batch_size].to(device)
    input_nodes, _, blocks = NeighborSampler(fanouts).sample(dg, seeds)
    x = torch.randn(len(input_nodes), width, dtype=dtype, device=device)
    y = torch.randint(0, 3, (batch_size,), device=device)
    return blocks, x, y


def _padded(fanouts, batch_size, n, blocks, x, y):
    """A PaddedBatch sized for ``blocks``, as SampledStep makes it."""
    return PaddedBatch(fanouts, batch_size, n, x, y, seen_sizes(blocks))


def test_padded_blocks_are_csrs_within_the_fanout_holding_the_real_ones():
    n = int(torch.randint(60, 400, ()))
    fanouts, batch_size = [int(f) for f in torch.randint(1, 7, (3,))], 16
    blocks, x, y = _batch(_graph(n), fanouts, batch_size)
    batch = _padded(fanouts, batch_size, n, blocks, x, y)
    assert batch.fits(blocks, x, y)
    for _ in range(2):  # a second batch over the first one's leftovers
        if not batch.fits(blocks, x, y):  # larger than the one it was sized for
            batch = batch.grown(blocks)
            assert batch.fits(blocks, x, y)
        batch.load(blocks, x, y)
        padded = batch.blocks()
        for layer, (real, pad) in enumerate(zip(blocks, padded)):
            plan, rows = pad.plan, real.num_dst_nodes()
            assert pad.num_src_nodes() == batch.src_cap[layer] >= pad.num_dst_nodes()
            if layer:
                assert pad.num_src_nodes() == padded[layer - 1].num_dst_nodes()
            assert int(plan.indptr[0]) == 0 and int(plan.indptr[-1]) == plan.num_edges
            degrees = plan.in_degrees
            assert int(degrees.min()) >= 0 and int(degrees.max()) <= fanouts[layer]
            edges = real.num_edges()
            assert torch.equal(plan.indptr[:rows + 1], real.plan.indptr)
            assert torch.equal(plan.indices[:edges], real.plan.indices)
            # padding edges come from the rows right after the real ones, at most a fan-out
            # each: the transposed CSR's empty rows all come last (cuSPARSE is slow on a run
            # of empty rows between nonempty ones)
            used = torch.unique(plan.indices[edges:])
            assert torch.equal(used, torch.arange(real.num_src_nodes(),
                                                  real.num_src_nodes() + used.numel()))
            assert used.numel() <= batch.pad_rows[layer]
            padding_out = plan.out_degrees[real.num_src_nodes():]
            assert int(padding_out.max()) <= fanouts[layer]
            assert int(padding_out.sum()) == plan.num_edges - edges
        assert torch.equal(batch.features[:len(x)], x) and torch.equal(batch.labels, y)
        assert not batch.features[len(x):].any()  # nothing of an earlier batch
        batch.features[-1] = float("nan")  # as an earlier, larger batch's row: cleared next
        blocks, x, y = _batch(_graph(n), fanouts, batch_size)


def test_a_batch_without_edges_is_padded_and_fits():
    """Seeds without in-edges (a layer of no edges sized the padding): a padding row still
    holds its slots, and the batch loads."""
    n = int(torch.randint(40, 100, ()))
    blocks, x, y = _batch(dgl.graph(([], []), num_nodes=n), [3, 2], 8)
    assert [b.num_edges() for b in blocks] == [0, 0]
    batch = _padded([3, 2], 8, n, blocks, x, y)
    assert batch.fits(blocks, x, y) and min(batch.pad_rows) >= 1
    batch.load(blocks, x, y)
    padded = batch.blocks()
    assert [b.num_dst_nodes() for b in padded] == batch.dst_cap
    assert all(int(b.plan.indptr[-1]) == b.num_edges() == 0 for b in padded)


@pytest.mark.parametrize("model_name", ["sage", "gcn", "gin"])
@pytest.mark.parametrize("k", [None, 3])
def test_a_model_over_padded_blocks_computes_the_real_rows_and_gradients(model_name, k):
    n, fanouts, batch_size = int(torch.randint(80, 300, ())), [4, 3, 2], 12
    blocks, x, y = _batch(_graph(n), fanouts, batch_size)
    model = build_model(model_name, 6, 8, 3, 3, k=k or 4, dropout=0.0,
                        nonlinearity="relu" if k is None else "maxk").double()
    batch = _padded(fanouts, batch_size, n, blocks, x, y)
    batch.load(blocks, x, y)

    def run(graph, features):
        model.zero_grad(set_to_none=True)
        out = model(graph, features)[:batch_size]
        torch.nn.functional.cross_entropy(out, y).backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()]
    want, want_grads = run(blocks, x)
    got, grads = run(batch.blocks(), batch.features)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10)


def test_sized_padding_fits_like_batches_in_far_less_room_and_grows_for_larger_ones():
    """Sized by the batches seen (grown for each that did not fit, as the graphed step does),
    the fixed blocks hold all of them in far less room than the worst case where sampled
    neighbourhoods overlap; a batch with far more nodes does not fit, and the grown batch
    holds both."""
    n, fanouts, batch_size = 3000, [5, 4, 3], 64
    graph = _regular_graph(n, 6)  # batches alike (rows without in-edges vary them more)
    seen = [_batch(graph, fanouts, batch_size) for _ in range(9)]
    blocks, x, y = seen[0]
    sized = _padded(fanouts, batch_size, 10 * n, blocks, x, y)
    for batch in seen[1:]:
        sized = sized if sized.fits(*batch) else sized.grown(batch[0])
    assert all(sized.fits(*batch) for batch in seen)
    bounds = _bounds(fanouts, batch_size, 10 * n)  # the most the fan-outs allow
    worst_edges = [dst * f for (dst, _), f in zip(bounds, fanouts)]
    assert sum(sized.edge_cap) < sum(worst_edges)
    assert sized.src_cap[0] < 0.8 * bounds[0][1]
    assert all(e <= w for e, w in zip(sized.edge_cap, worst_edges))
    assert all(r <= dst for r, (dst, _) in zip(sized.dst_real, bounds))
    # a graph ten times larger: the neighbourhoods hardly overlap, so more source nodes
    wide, xw, yw = _batch(_regular_graph(10 * n, 6), fanouts, batch_size)
    assert wide[0].num_src_nodes() > 1.2 * blocks[0].num_src_nodes()
    assert not sized.fits(wide, xw, yw)
    grown = sized.grown(wide)
    assert grown.fits(wide, xw, yw) and grown.fits(blocks, x, y)
    assert grown.grown(blocks).dst_cap == grown.dst_cap  # nothing new seen: same sizes


def test_fits_only_full_batches_of_the_samplers_blocks():
    n, fanouts, batch_size = 200, [3, 2], 10
    graph = _graph(n)
    blocks, x, y = _batch(graph, fanouts, batch_size)
    batch = _padded(fanouts, batch_size, n, blocks, x, y)
    assert batch.fits(blocks, x, y)
    small, xs, ys = _batch(graph, fanouts, batch_size - 1)
    assert not batch.fits(small, xs, ys)  # the last, smaller batch of an epoch
    assert not _padded([3, 1], batch_size, n, blocks, x, y).fits(blocks, x, y)  # other fan-outs
    assert not batch.fits(blocks, x.float(), y)  # features of another dtype
    assert not batch.fits(blocks, x[:, :4], y)
    assert not batch.fits(blocks[1:], x, y)
    src, dst = blocks[0].plan.indices, blocks[0].plan.dst_of_edge
    dgl_blocks = [dgl.create_block((src, dst), num_src_nodes=blocks[0].num_src_nodes(),
                                   num_dst_nodes=blocks[0].num_dst_nodes()), blocks[1]]
    assert not batch.fits(dgl_blocks, x, y)


def test_fanouts_far_above_the_degrees_pad_to_the_batchs_own_sizes():
    """Padded to fan-out x rows a batch would hold 10^6 times its edges; sized by the first
    full batch it holds them with the margin's headroom, whatever the fan-outs."""
    n = 300
    blocks, x, y = _batch(_graph(n), [10**6, 3], 16)
    model = build_model("sage", 6, 8, 3, 2, k=4, dropout=0.0).double()
    run = SampledStep(model, torch.optim.Adam(model.parameters()), [10**6, 3], 16, n,
                      cuda_graph=True)
    assert run._fits(blocks, x, y) and run.graphed
    batch = run.batch
    for block, slots, real in zip(blocks, batch.edge_cap, batch.dst_real):
        assert block.num_edges() <= slots <= math.ceil(block.num_edges() * _MARGIN)
        assert block.num_dst_nodes() <= real <= math.ceil(block.num_dst_nodes() * _MARGIN)
    assert [i.numel() for i in batch.indices] == batch.edge_cap


def test_sampled_step_off_the_gpu_is_train_step(monkeypatch):
    """On the CPU every batch runs train_step on the sampler's own blocks (nothing
    padded)."""
    from dgl_maxk.training import sampled_step
    n, fanouts = 150, [3, 2]
    calls = []

    def spy(model, blocks, *args, **kwargs):
        calls.append(blocks)
        return step_module.train_step(model, blocks, *args, **kwargs)
    monkeypatch.setattr(sampled_step, "train_step", spy)
    model = build_model("sage", 6, 8, 3, 2, k=3, dropout=0.0).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = SampledStep(model, opt, fanouts, 10, n)
    for _ in range(3):
        blocks, x, y = _batch(_graph(n), fanouts, 10)
        loss = run(blocks, x, y)
        assert calls[-1] is blocks and loss.dim() == 0
    assert run.batch is None and run.replays == 0


def test_gradient_buffers_follow_the_trained_parameters():
    """Each trained parameter's gradient is a view of a flat buffer; freezing one makes the
    buffers again without it, and leaves its gradient None (as zero_grad would), so that the
    optimizer leaves it alone."""
    model = build_model("sage", 6, 8, 3, 2, k=3, dropout=0.0)
    run = SampledStep(model, torch.optim.Adam(model.parameters()), [3, 2], 10, 150)
    run._bind_grads()
    (flat,) = run._grads[1]
    assert all(p.grad.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
               for p in model.parameters())
    model.lin_out.weight.requires_grad_(False)
    run._bind_grads()
    assert model.lin_out.weight.grad is None
    (smaller,) = run._grads[1]
    assert smaller.numel() == flat.numel() - model.lin_out.weight.numel()
    run._bind_grads()
    assert run._grads[1][0] is smaller  # unchanged parameters: the same buffers


def test_layers_that_refuse_zero_in_degree_rows_are_not_padded():
    from dgl_maxk.nn import GraphConv
    for allow, graphed in ((False, False), (True, True)):
        model = torch.nn.Sequential(GraphConv(4, 4, allow_zero_in_degree=allow))
        run = SampledStep(model, torch.optim.SGD(model.parameters(), lr=0.1), [3], 10, 150)
        assert run.graphed is graphed


# --------------------------------------------------------------------------- on a GPU


def _fitting_batches(graph, count):
    """``count`` full CUDA batches whose sizes fit a step sized by the first (the graphed
    step grows its padding for one that does not: tested on its own), so that the replay
    counts below do not depend on how the random batches vary: the first is the batch of a
    pool that the most others fit."""
    pool = [_batch(graph, [4, 3, 2], 32, "cuda", torch.float32) for _ in range(20 * count)]

    def fitting(first):
        sized = PaddedBatch([4, 3, 2], 32, graph.num_nodes(), first[1], first[2],
                            seen_sizes(first[0]))
        return [batch for batch in pool if batch is not first and sized.fits(*batch)]

    first = max(pool, key=lambda batch: len(fitting(batch)))
    others = fitting(first)
    if len(others) < count - 1:
        pytest.fail(f"at most {len(others)} of {len(pool)} batches fit one's padding")
    return [first] + others[:count - 1]


def _train(graphed, batches, model_name="sage", optimizer=torch.optim.SGD, seed=0):
    torch.manual_seed(seed)
    model = build_model(model_name, 6, 16, 3, 3, k=4, dropout=0.0).cuda()
    opt = optimizer(model.parameters(), lr=0.05)
    run = SampledStep(model, opt, [4, 3, 2], 32, 500, precision="fp32", cuda_graph=graphed)
    losses = [float(run(*batch)) for batch in batches]
    return losses, [p.detach().cpu() for p in model.parameters()], run


@needs_kernels
@pytest.mark.parametrize("model_name", ["sage", "gcn", "gin"])
def test_graphed_sampled_step_trains_as_the_eager_step(model_name):
    """Six full batches and a smaller last one, dropout off: the graphed step (an eager
    padded step, a captured one, four replays, then the last batch eagerly) gives the
    losses and weights of train_step on the sampler's blocks."""
    graph = _graph(500)
    batches = _fitting_batches(graph, 6)
    batches.append(_batch(graph, [4, 3, 2], 20, "cuda", torch.float32))
    want_losses, want_weights, eager = _train(False, batches, model_name)
    losses, weights, run = _train(True, batches, model_name)
    assert eager.replays == 0 and run.replays == 4 and run.graphed
    assert len(set(losses)) == len(losses)  # each batch's loss differs: new data replayed
    torch.testing.assert_close(losses, want_losses, rtol=1e-4, atol=1e-5)
    for got, want in zip(weights, want_weights):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@needs_kernels
def test_a_replay_after_evaluation_trains_the_model_again():
    """A model put in eval mode between steps (evaluation) is back in training mode, every
    module, after the next step, a replay."""
    batches = _fitting_batches(_graph(500), 4)
    _, _, run = _train(True, batches[:3])
    run.model.eval()
    run(*batches[3])
    assert run.replays == 2
    assert all(module.training for module in run.model.modules())


@needs_kernels
def test_a_batch_larger_than_the_padding_grows_it_and_trains_as_the_eager_step():
    """A batch with twice the edges the padding was sized for (from a graph over the same
    nodes, of in-degree 6 instead of 2) is padded anew and captured again; the smaller
    batches after it fit the grown padding. Losses and weights are those of train_step."""
    small = _fitting_batches(_regular_graph(500, 2), 6)
    large = _batch(_regular_graph(500, 6), [4, 3, 2], 32, "cuda", torch.float32)
    blocks, x, y = small[0]
    assert not PaddedBatch([4, 3, 2], 32, 500, x, y, seen_sizes(blocks)).fits(*large)
    # warm, capture, replay; grown: warm, capture, replay, replay
    batches = small[:3] + [large] + small[3:]
    want_losses, want_weights, _ = _train(False, batches)
    losses, weights, run = _train(True, batches)
    assert (run.padded_steps, run.captures, run.replays) == (2, 2, 3) and run.graphed
    torch.testing.assert_close(losses, want_losses, rtol=1e-4, atol=1e-5)
    for got, want in zip(weights, want_weights):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("optimizer,raised_by", [
    (torch.optim.SGD, "this call"),
    (functools.partial(torch.optim.Adam, fused=True), "the next call"),
    (functools.partial(torch.optim.Adam, fused=True), "read_checks")],
    ids=["sgd", "fused-adam-next-call", "fused-adam-read-checks"])
def test_graphed_sampled_step_raises_on_nan_with_the_weights_unchanged(optimizer, raised_by):
    """SGD steps after the read, so the replay that meets the NaN raises it. Fused Adam is
    queued before the read and skips on the GPU, and a replay's scans are read one call
    later: by the next call (a replay, whose step is skipped too) or by read_checks. The
    weights and the optimizer's state are then those from before the NaN batch."""
    graph = _graph(500)
    batches = _fitting_batches(graph, 4)
    _, _, run = _train(True, batches[:3], optimizer=optimizer)
    assert run.replays == 1
    blocks, x, y = batches[3]
    row = int(torch.randint(0, blocks[0].num_dst_nodes(), ()))
    x = x.clone()
    x[row, 2] = float("nan")
    before = [p.detach().clone() for p in run.model.parameters()]
    state = optimizer_state(run.optimizer)
    # lin_in spreads the NaN over its row: the first conv finds it
    nan_raised = pytest.raises(ValueError, match=rf"the first at index \({row}, 0\)")
    if raised_by == "this call":
        with nan_raised:
            run(blocks, x, y)
    else:
        run(blocks, x, y)
        replays = run.replays
        with nan_raised:
            run(*batches[1]) if raised_by == "the next call" else run.read_checks()
        if raised_by == "the next call":  # a replay raised it, its own scans still unread
            assert run.replays == replays + 1 and run._unread is not None
    for a, b in zip(before, run.model.parameters()):
        torch.testing.assert_close(b.detach(), a, rtol=0, atol=0)
    torch.testing.assert_close(optimizer_state(run.optimizer), state, rtol=0, atol=0)
    replays = run.replays
    run(*batches[0])  # the next clean batch replays, and steps: the skip lasted one step
    run.read_checks()
    assert run.replays == replays + 1
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, run.model.parameters()))


@needs_kernels
def test_a_step_that_reads_on_the_host_warns_and_trains_eagerly():
    graph = _graph(500)
    batches = [_batch(graph, [4, 3, 2], 32, "cuda", torch.float32) for _ in range(5)]
    want_losses, want_weights, _ = _train(False, batches)
    torch.manual_seed(0)
    model = ReadsOnTheHost(build_model("sage", 6, 16, 3, 3, k=4, dropout=0.0).cuda())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    run = SampledStep(model, opt, [4, 3, 2], 32, 500, precision="fp32")
    with pytest.warns(RuntimeWarning, match="cannot be captured") as caught:
        losses = [float(run(*batch)) for batch in batches]
    assert len([w for w in caught if "cannot be captured" in str(w.message)]) == 1
    assert not run.graphed and run.replays == 0
    torch.testing.assert_close(losses, want_losses, rtol=1e-4, atol=1e-5)
    for got, want in zip(model.parameters(), want_weights):
        torch.testing.assert_close(got.detach().cpu(), want, rtol=1e-4, atol=1e-5)


@needs_kernels
def test_graphed_step_replays_while_the_sampler_thread_samples_ahead(recwarn):
    """The sampler's own synchronisations on its thread neither stop the capture nor count
    as the step's: every full batch replays but those that size the padding (an eager step
    and a capture each), without a warning."""
    from dgl_maxk.training import sampling
    graph = _regular_graph(2000, 6)
    torch.manual_seed(0)
    model = build_model("sage", 6, 16, 3, 3, k=4, dropout=0.5).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    run = SampledStep(model, opt, [4, 3, 2], 64, 2000)
    x = torch.randn(2000, 6, device="cuda")
    y = torch.randint(0, 3, (2000,), device="cuda")
    loader = sampling.device_loader(DeviceGraph.from_dgl(graph, "cuda"), torch.arange(2000),
                                    [4, 3, 2], 64, seed=0, prefetch=2)
    stats = sampling.train_epoch(run, loader, x, y, torch.device("cuda"))
    full = 2000 // 64
    # each sizing of the padding (a batch outside it grows it) costs an eager step, and the
    # next full batch is captured unless it grows the padding again; every other full
    # batch replays
    assert stats["steps"] == full + 1
    assert 1 <= run.captures <= run.padded_steps <= 3
    assert run.padded_steps + run.captures + run.replays == full
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]
    assert all(torch.isfinite(p).all() for p in model.parameters())


def _data_parallel_worker(rank, store_path, out_path):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank,
                            world_size=2)
    try:
        torch.manual_seed(rank)  # other initial weights on each process: rank 0's must win
        model = build_model("sage", 6, 8, 3, 2, k=3, dropout=0.0).double()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        run = SampledStep(model, opt, [3, 2], 10, 150)
        start = [p.detach().clone() for p in model.parameters()]
        graph = _graph(150)  # each process its own batches
        grads, own = [], []
        for _ in range(2):
            batch = _batch(graph, [3, 2], 10)
            alone = copy.deepcopy(model)  # this process's gradient, on its own
            alone.zero_grad(set_to_none=True)
            step_module._forward_backward(alone, *batch, None, False, 0.0, "fp32")
            own.append([p.grad for p in alone.parameters()])
            run(*batch)
            grads.append([p.grad.clone() for p in model.parameters()])
        torch.save({"start": start, "end": [p.detach() for p in model.parameters()],
                    "grads": grads, "own": own}, f"{out_path}.{rank}")
    finally:
        dist.destroy_process_group()


def test_data_parallel_steps_keep_the_processes_in_step(tmp_path):
    """Under a process group of two, without DDP: both processes start from rank 0's
    weights, take the same (averaged) gradients, and end with the same weights."""
    import torch.multiprocessing as mp
    mp.start_processes(_data_parallel_worker, args=(str(tmp_path / "store"),
                                                    str(tmp_path / "out")),
                       nprocs=2, start_method="spawn")
    zero, one = (torch.load(tmp_path / f"out.{r}") for r in (0, 1))
    for key in ("start", "end"):
        for a, b in zip(zero[key], one[key]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    for step_a, step_b, own_a, own_b in zip(zero["grads"], one["grads"], zero["own"],
                                            one["own"]):
        for a, b, mine, theirs in zip(step_a, step_b, own_a, own_b):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
            torch.testing.assert_close(a, (mine + theirs) / 2, rtol=1e-12, atol=1e-12)
    assert any(not torch.equal(a, b) for a, b in zip(zero["start"], zero["end"]))


@needs_kernels
def test_freezing_a_parameter_between_replays_captures_again_without_it():
    graph = _graph(500)
    batches = _fitting_batches(graph, 8)
    losses, _, run = _train(True, batches[:4], optimizer=torch.optim.Adam)
    assert run.replays == 2
    frozen = run.model.lin_out.weight
    frozen.requires_grad_(False)
    before = frozen.detach().clone()
    for batch in batches[4:]:  # an eager padded step, a capture, two replays
        run(*batch)
    assert run.replays == 4 and frozen.grad is None
    torch.testing.assert_close(frozen.detach(), before, rtol=0, atol=0)
