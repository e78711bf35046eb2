"""Diagnose test_on_cuda_the_graphed_compiled_ar_step_matches_the_unfused_one: tokens and per-step error."""
import sys, torch
sys.path.insert(0, "tests")
from ready.target import layers
from ready.decode.graphs import GraphRunner
from tiny_models import VOCAB, small_target

def target():
    model = small_target(num_layers=4, seed=11).to(torch.bfloat16).requires_grad_(False)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model.cuda()

mod = layers.FUSED_GEMV
t = target(); t.compile_layers(True)
ids = torch.randint(0, VOCAB, (1, 12), device="cuda", generator=torch.Generator("cuda").manual_seed(4))
def ar(on, hoist=True):
    layers.FUSED_GEMV = mod if on else None
    saved = t._pass_rope
    if not hoist:
        t._pass_rope = lambda *a: None
    cache = t.new_cache(1, 48, max_verify=1); r = GraphRunner(t, []); r.prepare(cache)
    tok = t.prefill(ids, cache).logits[:, -1:].argmax(-1); L, T = [], []
    for _ in range(8):
        out = r.step(tok, cache); L.append(out.logits[0, -1].float().clone()); tok = out.logits[:, -1:].argmax(-1); T.append(int(tok))
    t._pass_rope = saved
    return torch.stack(L), T
res = {}
for name, on, hoist in [("plain", False, True), ("fast", True, True), ("plain_nohoist", False, False), ("fast_nohoist", True, False)]:
    res[name] = ar(on, hoist)
    print(name, res[name][1], flush=True)
for a, b in [("plain", "fast"), ("plain_nohoist", "fast_nohoist"), ("plain", "plain_nohoist"), ("fast", "fast_nohoist")]:
    e = ((res[a][0] - res[b][0]).norm(dim=-1) / res[b][0].norm(dim=-1)).tolist()
    print(a, "vs", b, [round(x, 4) for x in e])
