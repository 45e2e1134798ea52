"""VidCom2 against its definition (pruning/vidcom2.py): the mask equals a reference written here from the
authors' equations, token by token in float64 Python, on random embeddings whose channels differ in spread and
whose frames differ in uniqueness, on both ways to the project's exact count (dropping from the authors'
budgets and adding to them), and on exact ties; the budgets are the authors' rounding."""

import math
from fractions import Fraction

import pytest
import torch

import pruning
from pruning.vidcom2 import frame_budgets, vidcom2_scores

KERNEL_WIDTHS = (1 / 8, 1 / 4, 1 / 2, 1, 2)


def reference_vidcom2(features: torch.Tensor, t: int, h: int, w: int, q: float) -> tuple[list[bool], list[int]]:
    """(the kept tokens in raster order, the authors' per-frame budgets), from the equations alone."""
    rows = features.double().tolist()
    n, d, m = len(rows), len(rows[0]), h * w

    # The lowest-variance half of the channels (population variance over every token); at least one.
    def variance(c: int) -> float:
        mean = sum(row[c] for row in rows) / n
        return sum((row[c] - mean) ** 2 for row in rows) / n

    channels = sorted(range(d), key=lambda c: (variance(c), c))[: max(1, d // 2)]
    x = []
    for row in rows:  # unit vectors on those channels (a zero vector stays zero)
        values = [row[c] for c in channels]
        norm = math.sqrt(sum(v * v for v in values))
        x.append([v / norm if norm > 0 else 0.0 for v in values])

    def centre(tokens: list[list[float]]) -> list[float]:
        return [sum(column) / len(tokens) for column in zip(*tokens)]

    def similarity(a: list[float], g: list[float]) -> float:  # sum of Gaussian kernels, width 2a each
        distance_sq = sum((ai - gi) ** 2 for ai, gi in zip(a, g))
        return sum(math.exp(-distance_sq / (2 * alpha)) for alpha in KERNEL_WIDTHS)

    video_centre = centre(x)
    frame_centres = [centre(x[f * m : (f + 1) * m]) for f in range(t)]
    to_video = [similarity(x[i], video_centre) for i in range(n)]
    redundancy = [to_video[i] + similarity(x[i], frame_centres[i // m]) for i in range(n)]

    # Frame budgets: uniqueness u_f = -mean similarity to the video centre, softmax at 0.01, the share
    # (1 - q)(1 + sigma_f - mean sigma) at most 1, times m, rounded half to even, at least 1.
    uniqueness = [-sum(to_video[f * m : (f + 1) * m]) / m for f in range(t)]
    exps = [math.exp((u - max(uniqueness)) / 0.01) for u in uniqueness]
    sigma = [e / sum(exps) for e in exps]
    budgets = [max(1, round(min(1.0, (1 - q) * (1 + s - sum(sigma) / t)) * m)) for s in sigma]

    # Each frame keeps its budget's least redundant tokens, the earlier token first among equals.
    kept = set()
    for f in range(t):
        kept |= set(sorted(range(f * m, (f + 1) * m), key=lambda i: (redundancy[i], i))[: budgets[f]])
    # Then to the exact count, one token at a time over the whole video: drop the most redundant kept token
    # of a frame that keeps more than one (the later among equals), or add the least redundant unkept one.
    count = max(m, t, math.floor(t * m * (1 - Fraction(repr(q)))))
    by_redundancy = sorted(range(n), key=lambda i: (redundancy[i], i))
    while len(kept) > count:
        kept.remove(next(i for i in reversed(by_redundancy) if i in kept and sum(j // m == i // m for j in kept) > 1))
    while len(kept) < count:
        kept.add(next(i for i in by_redundancy if i not in kept))
    return [i in kept for i in range(n)], budgets


def embeddings(seed: int, t: int, m: int, d: int, frame_offsets: list[float] | None) -> torch.Tensor:
    """(t*m, d) random tokens, channel c spread by 10^(-1..1) so that which half is scored matters; with
    frame_offsets, frame f moved by frame_offsets[f] along its own random direction (unequal uniqueness)."""
    generator = torch.Generator().manual_seed(seed)
    spread = 10 ** (2 * torch.rand(d, generator=generator) - 1)
    tokens = torch.randn(t, m, d, generator=generator) * spread
    if frame_offsets is not None:
        directions = torch.randn(t, 1, d, generator=generator)
        tokens = tokens + torch.tensor(frame_offsets)[:, None, None] * directions
    return tokens.reshape(t * m, d)


# (seed, (T, h, w), D, q, frame offsets): each case says which way it reaches the exact count. Chosen where no
# share is within 1e-3 of a half and no two scores within 1e-5, so float32 and float64 make the same choices.
CASES = {
    "drop": [
        (12, (9, 3, 3), 24, 0.3, [8, 0.2, 0, 8, 0, 3, 0, 0, 0]),
        (13, (3, 2, 4), 22, 0.3, None),
        (19, (4, 4, 3), 18, 0.5, None),
        (24, (6, 4, 3), 23, 0.7, [0.2, 0, 8, 3, 3, 8]),
        (35, (5, 2, 2), 10, 0.75, [0, 0, 6, 0, 0]),  # the token dropped is not a one-token frame's
    ],
    "add": [
        (11, (6, 2, 2), 20, 0.3, None),
        (15, (5, 2, 4), 12, 0.9, None),
        (16, (5, 2, 3), 22, 0.3, [0, 8, 8, 0, 0]),
        (20, (5, 4, 4), 16, 0.3, [0.2, 8, 3, 0, 0]),
    ],
}


@pytest.mark.parametrize(
    "way, case", [pytest.param(way, case, id=f"{way}-{case[0]}") for way, cases in CASES.items() for case in cases]
)
def test_vidcom2_is_its_definition_on_random_embeddings(way, case):
    seed, (t, h, w), dim, q, offsets = case
    features = embeddings(seed, t, h * w, dim, offsets)
    expected, budgets = reference_vidcom2(features, t, h, w, q)
    count = pruning.kept_token_count("vidcom2", h * w, t, q)
    assert (sum(budgets) > count) if way == "drop" else (sum(budgets) < count)  # the case tests what it says
    if offsets is not None:  # frames of very unequal uniqueness get unequal budgets
        assert max(budgets) > min(budgets), budgets

    mask = pruning.retention_mask(features, (t, h, w), q, "vidcom2")

    assert mask.tolist() == expected
    assert int(mask.sum()) == count and min(pruning.tokens_kept_per_group(mask, (t, h, w)).tolist()) >= 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_vidcom2_scores_half_precision_embeddings_in_float32(dtype):
    features = embeddings(16, 5, 6, 22, [0, 8, 8, 0, 0]).to(dtype)
    expected, _ = reference_vidcom2(features, 5, 2, 3, 0.3)
    assert pruning.retention_mask(features, (5, 2, 3), 0.3, "vidcom2").tolist() == expected


def test_vidcom2_ties_go_to_the_earlier_token():
    """Frames 0 and 1 are the same two tokens twice, so every score ties with its copies: the earlier copy is
    kept first and dropped last, within a frame and over the video."""
    a, b = [1.0, 0.0, 2.0, 0.5], [0.0, 1.0, -2.0, 0.4]
    other = [[3.0, 1.0, 0.0, 0.1], [1.0, 3.0, 1.0, 0.2], [2.0, 2.0, -1.0, 0.3], [0.5, 0.5, 0.5, 0.6]]
    features = torch.tensor([a, a, b, b] * 2 + other)

    def kept(q: float) -> list[list[int]]:
        mask = pruning.retention_mask(features, (3, 2, 2), q, "vidcom2")
        assert mask.tolist() == reference_vidcom2(features, 3, 2, 2, q)[0]
        return mask.reshape(3, 4).int().tolist()

    # The authors' budgets are 3, 3, 2 (b's two copies, then the first a): eight, the count.
    assert kept(0.3) == [[1, 0, 1, 1], [1, 0, 1, 1], [1, 0, 1, 0]]
    # Budgets 2, 2, 1 for a count of 6: the one token added is an a, frame 0's before frame 1's.
    assert kept(0.5) == [[1, 0, 1, 1], [0, 0, 1, 1], [1, 0, 0, 0]]
    # The same budgets for a count of 4: the one token dropped is a b, frame 1's before frame 0's.
    assert kept(0.6) == [[0, 0, 1, 1], [0, 0, 1, 0], [1, 0, 0, 0]]
    # Every token equal: every score ties, and each frame keeps its first two.
    flat = pruning.retention_mask(torch.ones(12, 2), (3, 2, 2), 0.5, "vidcom2")
    assert flat.reshape(3, 4).int().tolist() == [[1, 1, 0, 0]] * 3


def test_frame_budgets_are_the_authors_rounding():
    # Frame 1 is the most unique by 0.4, so sigma is one-hot there: shares 0.7 * 1.8, capped at 1, and 0.7 * 0.8.
    uniqueness = torch.tensor([0.0, 0.5, -0.2, 0.1, 0.0])
    assert frame_budgets(uniqueness, 5, 0.3).tolist() == [3, 5, 3, 3, 3]  # 2.8 rounds to 3; 1.26 * 5 caps at 5
    equal = torch.zeros(2)
    assert frame_budgets(equal, 5, 0.5).tolist() == [2, 2]  # 2.5 rounds half to even, as torch.round does
    assert frame_budgets(equal, 4, 0.9).tolist() == [1, 1]  # 0.4 rounds to 0: at least one token a frame


def with_loud_channels(tokens: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """tokens (N, C) and C channels more of noise with a spread of 1: the higher-variance half, never scored."""
    noise = torch.randn(tokens.shape, generator=torch.Generator().manual_seed(seed))
    return torch.cat([tokens, noise], dim=1)


def test_vidcom2_gives_the_unique_frame_the_larger_budget():
    """Four frames of 2x2 tokens: three alike (near e1), one unlike the rest of the video (near e2), on the
    quiet channels; the loud ones are noise the method does not read."""
    generator = torch.Generator().manual_seed(0)
    e1, e2 = 0.3 * torch.eye(4)[0], 0.3 * torch.eye(4)[1]
    frames = torch.stack([e1, e1, e2, e1])[:, None, :] + 0.01 * torch.randn(4, 4, 4, generator=generator)
    features = with_loud_channels(frames.reshape(16, 4))

    frame_uniqueness, _ = vidcom2_scores(features, (4, 2, 2))
    assert int(frame_uniqueness.argmax()) == 2
    # The authors' budgets at q = 0.4: 0.6 * (1 + 1 - 1/4) = 1.05, capped at 1, times 4; 0.6 * (1 - 1/4) * 4 = 1.8.
    assert frame_budgets(frame_uniqueness, 4, 0.4).tolist() == [2, 2, 4, 2]
    kept = pruning.tokens_kept_per_group(pruning.retention_mask(features, (4, 2, 2), 0.4, "vidcom2"), (4, 2, 2))
    assert kept.sum() == 9 and kept[2] == 4 and kept.min() >= 1, kept  # one over the count: an alike frame's


def test_vidcom2_keeps_the_token_unlike_its_frame():
    """Every frame alike, each with one token pointing elsewhere: at one token a frame, that one is kept."""
    tokens = 0.3 * torch.tensor([[1.0, 0.0], [1.0, 0.01], [0.0, 1.0], [1.0, 0.02]])
    features = with_loud_channels(tokens.repeat(4, 1))
    mask = pruning.retention_mask(features, (4, 2, 2), 0.75, "vidcom2")
    assert mask.reshape(4, 4).tolist() == [[False, False, True, False]] * 4
