"""Train the difficulty router on labeled prompts (dev split only).

    .venv/bin/python -m gateway.tools.train_router [--prompts ../shared/data/routing/labeled_prompts_dev.jsonl]
    (or: gateway route train)

Embeds each prompt with all-MiniLM-L6-v2 (cached under .cache/embeddings), adds the text
features of :mod:`gateway.routing.features`, and fits the ensemble of
:mod:`gateway.routing.difficulty` over three outcomes per prompt: only the weak model right,
both or neither, only the strong model right (from RouteLLM's per-prompt correctness data,
arXiv 2406.18665). The members, a multinomial logistic regression (scikit-learn) and four
one-hidden-layer MLPs (torch), each predict the expected accuracy gain of the strong model,
P(only strong right) - P(only weak right); the router averages them. Chosen by 5-fold
cross-validation on dev (weak-call share at 95% of strong accuracy; the test split is never
read here). The calibration curve stored with the artifact comes from the out-of-fold scores
on the same dev prompts, so policy targets map to thresholds without touching the test split.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from gateway.routing.difficulty import ARTIFACTS, ensemble_gain
from gateway.routing.features import FEATURE_NAMES, text_features

__all__ = ["LabeledPrompts", "Model", "calibration_curve", "fit", "load_prompts", "main",
           "outcome", "save_artifact"]

ROOT = Path(__file__).resolve().parents[2]
DEV = ROOT.parent / "shared" / "data" / "routing" / "labeled_prompts_dev.jsonl"
VERSION = "routellm-dev-gain-lr+mlp64x4-v1"
DIM = 384


@dataclass
class LabeledPrompts:
    prompts: list[str]
    source: np.ndarray  # "gsm8k", "mmlu", ... (the part before "/")
    weak: np.ndarray  # 1.0 when the weak model was right
    strong: np.ndarray  # 1.0 when the strong model was right


def load_prompts(path: Path) -> LabeledPrompts:
    """A JSONL file of {source, prompt, weak_correct, strong_correct} rows."""
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    return LabeledPrompts(
        [str(r["prompt"]) for r in rows],
        np.array([str(r.get("source", "")).split("/")[0] for r in rows]),
        np.array([float(bool(r["weak_correct"])) for r in rows]),
        np.array([float(bool(r["strong_correct"])) for r in rows]),
    )


def calibration_curve(score: np.ndarray, weak: np.ndarray, strong: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Routing by threshold: (thresholds, weak_share, quality) where prompts scoring below
    ``thresholds[i]`` go weak; quality is the accuracy reached, as a fraction of strong-only
    accuracy. The last threshold sends everything weak."""
    order = np.argsort(score, kind="stable")
    n = len(score)
    cw = np.concatenate([[0.0], np.cumsum(weak[order])])
    cs = np.concatenate([[0.0], np.cumsum(strong[order])])
    accuracy = (cw + strong.sum() - cs) / n
    thresholds = np.concatenate([score[order], [2.0]])
    return thresholds, np.arange(n + 1) / n, accuracy / max(strong.mean(), 1e-9)


def _fit_mlp(x: np.ndarray, y: np.ndarray, seed: int, hidden: int, epochs: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One softmax MLP over the three outcomes; weights as (w1, b1, w2, b2)."""
    import torch

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    # Layers are built in the Sequential's order, so the seeded initialisation is unchanged.
    first, last = torch.nn.Linear(x.shape[1], hidden), torch.nn.Linear(hidden, 3)
    net = torch.nn.Sequential(torch.nn.Dropout(0.2), first, torch.nn.ReLU(),
                              torch.nn.Dropout(0.3), last)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=5e-2)
    xt = torch.from_numpy(x.astype(np.float32))
    yt = torch.from_numpy(y.astype(np.int64))
    n = len(yt)
    for _ in range(epochs):
        net.train()
        for idx in torch.split(torch.randperm(n, generator=g), 128):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(xt[idx]), yt[idx])
            loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
            opt.step()
    return (first.weight.detach().numpy().T.copy(), first.bias.detach().numpy().copy(),
            last.weight.detach().numpy().T.copy(), last.bias.detach().numpy().copy())


@dataclass
class Model:
    mean: np.ndarray
    scale: np.ndarray
    lr_w: np.ndarray  # [features, 3]
    lr_b: np.ndarray  # [3]
    mlps: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]

    def score(self, x: np.ndarray) -> np.ndarray:
        """[n] expected accuracy gain of the strong tier, in [-1, 1]."""
        return ensemble_gain((x - self.mean) / self.scale, (self.lr_w, self.lr_b), self.mlps)


def outcome(weak: np.ndarray, strong: np.ndarray) -> np.ndarray:
    """The class of each prompt: 0 only weak right, 1 both or neither, 2 only strong right."""
    classes: np.ndarray = (strong - weak).astype(np.int64) + 1
    return classes


def fit(x: np.ndarray, y: np.ndarray, n_mlp: int = 4, hidden: int = 64, epochs: int = 8,
        c: float = 1.0, seed: int = 0) -> Model:
    """The ensemble on inputs ``x`` [n, DIM + features] and outcomes ``y`` (see outcome)."""
    from sklearn.linear_model import LogisticRegression

    # The embedding stays as it is (unit norm: its scale sets how strongly the L2 penalty
    # holds it back); the text features are standardised.
    mean, scale = np.zeros(x.shape[1]), np.ones(x.shape[1])
    mean[DIM:], scale[DIM:] = x[:, DIM:].mean(0), x[:, DIM:].std(0) + 1e-6
    z = (x - mean) / scale
    lr = LogisticRegression(C=c, max_iter=3000).fit(z, y)
    mlps = [_fit_mlp(z, y, seed + i, hidden, epochs) for i in range(n_mlp)]
    return Model(mean.astype(np.float32), scale.astype(np.float32),
                 lr.coef_.T.astype(np.float32), lr.intercept_.astype(np.float32), mlps)


def inputs(prompts: list[str]) -> np.ndarray:
    """[n, DIM + features]: the embedding and the text features of each prompt."""
    from gateway.tools.embeddings import embed_texts

    emb = embed_texts(prompts)
    feats = np.stack([text_features(p) for p in prompts])
    return np.hstack([emb, feats]).astype(np.float32)


def out_of_fold(x: np.ndarray, y: np.ndarray, strata: np.ndarray, folds: int = 5,
                **kwargs: object) -> np.ndarray:
    """Each prompt's score from a model that did not see it (stratified k-fold)."""
    from sklearn.model_selection import StratifiedKFold

    oof = np.zeros(len(y))
    for train, test in StratifiedKFold(folds, shuffle=True, random_state=0).split(x, strata):
        oof[test] = fit(x[train], y[train], **kwargs).score(x[test])  # type: ignore[arg-type]
    return oof


def save_artifact(path: Path, model: Model, calibration: tuple[np.ndarray, ...],
                  version: str = VERSION) -> None:
    """Write the artifact :class:`gateway.routing.difficulty.Router` loads."""
    thresholds, weak_share, quality = calibration
    arrays: dict[str, np.ndarray] = {
        "version": np.array(version), "dim": np.array(len(model.mean) - len(FEATURE_NAMES)),
        "feature_names": np.array(FEATURE_NAMES), "mean": model.mean, "scale": model.scale,
        "lr_w": model.lr_w, "lr_b": model.lr_b, "n_mlp": np.array(len(model.mlps)),
        "cal_thresholds": thresholds.astype(np.float32),
        "cal_weak_share": weak_share.astype(np.float32),
        "cal_quality": quality.astype(np.float32),
    }
    for i, (w1, b1, w2, b2) in enumerate(model.mlps):
        arrays |= {f"mlp{i}_w1": w1.astype(np.float32), f"mlp{i}_b1": b1,
                   f"mlp{i}_w2": w2, f"mlp{i}_b2": b2}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=Path, default=DEV)
    parser.add_argument("--out", type=Path, default=ARTIFACTS / "default.npz")
    args = parser.parse_args(argv)
    data = load_prompts(args.prompts)
    x = inputs(data.prompts)
    y = outcome(data.weak, data.strong)
    strata = np.unique(data.source, return_inverse=True)[1] * 4 + data.weak * 2 + data.strong
    oof = out_of_fold(x, y, strata.astype(np.int64))
    model = fit(x, y)
    calibration = calibration_curve(oof, data.weak, data.strong)
    save_artifact(args.out, model, calibration)
    print(orjson.dumps({"artifact": str(args.out), "version": VERSION, "prompts": len(y),
                        "strong_only_right": int((y == 2).sum()),
                        "weak_only_right": int((y == 0).sum())}).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
