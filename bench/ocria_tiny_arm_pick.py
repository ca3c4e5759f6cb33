"""Pick the better arm of an A/B on the training machine itself, so the winner can be continued in the next call
while the machine is still warm (a restart and a new staging cost ~100 s of a 1,800 s lease).

Each arm is a checkpoint kept with `SAVE_AS=DIR` by bench/ocria_tiny_gpu_run.sh and named by its recipe. The arms
are scored with the teacher-forced reading score (bench/ocria_tiny_teacher_forced.py, fp32 on the GPU) on held-out
pages; the arm with the higher top-1 is copied to the stage the next run resumes from, and its recipe is written
beside the stage, so the next call continues it with `RECIPE=$(cat /tmp/stage/recipe)`. The free-running CER of
every arm is measured afterwards on the CPU, as before: this pick only decides what to continue. The two can
disagree: in session 26 F2UL led fed the reference (0.898 against 0.891) and its continuation read the held-out
pages worst free, from longer loops at page ends (bench/results/ocria_tiny_commands.md).

  python3 bench/ocria_tiny_arm_pick.py --model-dir build/ocria-tiny-1536 --arm F2U=/tmp/arm_f2u \\
      --arm F2UL=/tmp/arm_f2ul --heldout 48 --out $OUT/arm_pick.json
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def arm_model_dir(model_dir: Path, checkpoint: Path, dest: Path) -> Path:
    """A loadable model folder: `model_dir`'s tokenizer and processor files with the checkpoint's weights."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in model_dir.iterdir():
        if f.is_file() and not f.name.startswith("model"):
            shutil.copy(f, dest / f.name)
    for f in checkpoint.iterdir():
        if f.name.startswith("model") or f.name == "config.json":
            shutil.copy(f, dest / f.name)
    return dest


def best_arm(scores: dict[str, float]) -> str:
    """The arm with the highest teacher-forced top-1 (the first named wins a tie)."""
    return max(scores, key=lambda name: scores[name])


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from bench import ocria_tiny_teacher_forced as teacher_forced

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", type=Path, required=True, help="tokenizer, processor and config files")
    ap.add_argument("--arm", action="append", required=True, help="RECIPE=CHECKPOINT_DIR; repeat for each arm")
    ap.add_argument("--config", type=Path, default=ROOT / "bench/results/ocria_tiny_eval_full_pages_1536_config.yaml")
    ap.add_argument("--synth", type=Path, default=Path(".synth"))
    ap.add_argument("--heldout", type=int, default=48)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--stage", type=Path, default=Path("/tmp/stage"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    arms = dict(a.split("=", 1) for a in args.arm)
    models = {name: arm_model_dir(args.model_dir, Path(ckpt), args.stage / f"score_{name}")
              for name, ckpt in arms.items()}
    scored = args.out.with_name(args.out.stem + "_teacher_forced.json")
    cmd = [a for m in models.values() for a in ("--model", str(m))]
    teacher_forced.main(cmd + ["--config", str(args.config), "--synth", str(args.synth), "--heldout", str(args.heldout),
                               "--device", args.device, "--out", str(scored)])
    summaries = json.loads(scored.read_text())["models"]
    scores = {name: summaries[str(m)]["summary"]["all"]["top1_accuracy"] for name, m in models.items()}
    winner = best_arm(scores)
    stage = args.stage / "ckpt"
    shutil.rmtree(stage, ignore_errors=True)
    shutil.copytree(arms[winner], stage)
    (args.stage / "recipe").write_text(winner + "\n")
    result = {"arms": arms, "top1": scores, "winner": winner, "staged": str(stage), "scores_file": scored.name}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
