"""Comparing logits and greedy continuations: kaon's against a reference's (the numpy float64
references of gemma3_ref.py / deepseek_ref.py, or transformers), and a reference against itself
(prefill vs decode) or against a literal transcription of transformers' code."""
import numpy as np


def rel_err(a, b):
    """Relative error of a against b: |a - b| / |b| (Frobenius norms)."""
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def assert_logits_match(ours, ref, tol, label):
    """ours within relative error tol of ref ([tokens, vocab]; printed with the worst
    position), and the same top-1 token wherever ref's top two are more than 0.05 apart."""
    err = rel_err(ours, ref)
    by_pos = [rel_err(ours[i], ref[i]) for i in range(len(ref))]
    worst = int(np.argmax(by_pos))
    print(f"{label}: relative logit error {err:.2e} (worst position {worst}: {by_pos[worst]:.2e})")
    assert err < tol, (label, err, worst, by_pos[worst])
    srt = np.sort(ref, -1)
    clear = srt[:, -1] - srt[:, -2] > 0.05
    assert (ours.argmax(-1) == ref.argmax(-1))[clear].all(), label


def assert_matches_transcription(lit, ref, label):
    """A reference's logits ref against those of a literal float32 transcription lit of
    transformers' code: relative error < 2e-5, the same top-1 at more than 90% of positions."""
    err = rel_err(lit.astype(np.float64), ref)
    print(f"{label}: reference vs literal transcription {err:.2e}")
    assert err < 2e-5
    assert (lit.argmax(-1) == ref.argmax(-1)).mean() > 0.9


def prefill_and_decode(ref, ids, first=5):
    """A reference's logits of ids in one forward, and again after reset() fed ids[:first] and
    then one id at a time (through its cache)."""
    a = ref.forward(ids)
    ref.reset()
    b = np.concatenate([ref.forward(ids[:first])] + [ref.forward([i]) for i in ids[first:]])
    return a, b


def greedy(ref, ids, n):
    """A reference's greedy continuation of ids: n new ids, and its top-2 margin at each step."""
    ref.reset()
    logits = ref.forward(ids)[-1]
    out, margins = [], []
    for i in range(n):
        srt = np.sort(logits)
        out.append(int(np.argmax(logits)))
        margins.append(float(srt[-1] - srt[-2]))
        if i + 1 < n:
            logits = ref.forward([out[-1]])[-1]
    return out, margins


def first_divergence(a, b):
    """The first index where two id lists differ (None: they agree as far as both go)."""
    return next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), None)


def assert_greedy_matches(got, want, margins, label):
    """kaon's greedy ids got against the reference's want (and its top-2 margins): as many, and
    a divergence may only start where the reference's top two are within 1e-3."""
    assert len(got) == len(want), got
    first = first_divergence(got, want)
    print(f"{label}: kaon {got}\n{' ' * len(label)}  ref  {want}")
    if first is not None:
        assert margins[first] < 1e-3, (first, got[first], want[first], margins[first])
