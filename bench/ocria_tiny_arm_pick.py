"""Pick the better arm of an A/B on the training machine itself, so the winner can be continued in the next call
while the machine is still warm (a restart and a new staging cost ~100 s of a 1,800 s lease).

Each arm is a checkpoint kept with `SAVE_AS=DIR` by bench/ocria_tiny_gpu_run.sh and named by its recipe. The arms
are scored on held-out pages `--heldout-from` .. + `--heldout` - 1 by one of two rules (`--by`):
  teacher_forced: the teacher-forced reading top-1 (bench/ocria_tiny_teacher_forced.py, fp32), higher wins;
  free_cer: the pooled free-running CER through the pipeline's engine (jobs.eval_ocr's native reader, bf16 on the
    GPU) with the loop drop + ban the pipeline decodes with, lower wins.
The winner's checkpoint is copied to the stage the next run resumes from, and its recipe is written beside the stage,
so the next call continues it with `RECIPE=$(cat /tmp/stage/recipe)`. The two rules can disagree: in session 26 F2UL
led fed the reference (0.898 against 0.891) and its continuation read the held-out pages worst free, from longer loops
at page ends (bench/results/ocria_tiny_commands.md). `--reference NAME=MODEL_DIR` scores a model beside the arms
(e.g. the shipped one) that is never staged. The free CER on the GPU only decides what to continue; what ships is
decided on the CPU (fp32) on pages no pick was made on.

  python3 bench/ocria_tiny_arm_pick.py --model-dir build/ocria-tiny-1536 --arm F2U=/tmp/arm_f2u \\
      --arm F2UP=/tmp/arm_f2up --by free_cer --heldout 96 --heldout-from 192 --out $OUT/arm_pick.json
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


def best_arm(scores: dict[str, float], higher_is_better: bool) -> str:
    """The arm with the best score (the first named wins a tie)."""
    sign = 1 if higher_is_better else -1
    return max(scores, key=lambda name: sign * scores[name])


def stage_checkpoint(checkpoint: Path, stage: Path) -> Path:
    """Copy the winner's checkpoint to the stage, unless it is the stage itself (an arm scored where it was trained,
    `--arm NAME=/tmp/stage/ckpt`: session 31's pick deleted it before copying)."""
    if stage.exists() and checkpoint.resolve() == stage.resolve():
        return stage
    shutil.rmtree(stage, ignore_errors=True)
    shutil.copytree(checkpoint, stage)
    return stage


def teacher_forced_top1(models: dict[str, Path], args) -> tuple[dict[str, float], list[str]]:
    from bench import ocria_tiny_teacher_forced as teacher_forced

    scored = args.out.with_name(args.out.stem + "_teacher_forced.json")
    cmd = [a for m in models.values() for a in ("--model", str(m))]
    teacher_forced.main(cmd + ["--config", str(args.config), "--synth", str(args.synth), "--heldout", str(args.heldout),
                               "--heldout-from", str(args.heldout_from), "--device", args.device, "--out", str(scored)])
    summaries = json.loads(scored.read_text())["models"]
    return {name: summaries[str(m)]["summary"]["all"]["top1_accuracy"] for name, m in models.items()}, [scored.name]


def free_running_cer(models: dict[str, Path], args) -> tuple[dict[str, float], list[str]]:
    from jobs import eval_ocr

    scores, files = {}, []
    for name, m in models.items():
        scored = args.out.with_name(f"{args.out.stem}_free_{name}.json")
        eval_ocr.main(["--model", str(m), "--config", str(args.config), "--synth", str(args.synth),
                       "--heldout", str(args.heldout), "--heldout-from", str(args.heldout_from), "--corpus-pages", "0",
                       "--no-tesseract", "--reader", "native", "--device", args.device, "--batch", str(args.heldout),
                       "--max-new-tokens", str(args.max_new_tokens), "--loop-drop-tokens", str(args.loop_drop_tokens),
                       "--loop-ban-next", "--out", str(scored)])
        scores[name] = json.loads(scored.read_text())["heldout_synthetic"]["model_text"]["cer"]
        files.append(scored.name)
    return scores, files


RULES = {"teacher_forced": (teacher_forced_top1, True), "free_cer": (free_running_cer, False)}


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", type=Path, required=True, help="tokenizer, processor and config files")
    ap.add_argument("--arm", action="append", required=True, help="RECIPE=CHECKPOINT_DIR; repeat for each arm")
    ap.add_argument("--config", type=Path, default=ROOT / "bench/results/ocria_tiny_eval_full_pages_1536_config.yaml")
    ap.add_argument("--synth", type=Path, default=Path(".synth"))
    ap.add_argument("--heldout", type=int, default=48)
    ap.add_argument("--heldout-from", type=int, default=0, help="the first held-out page's number")
    ap.add_argument("--by", choices=sorted(RULES), default="teacher_forced")
    ap.add_argument("--reference", action="append", default=[],
                    help="NAME=MODEL_DIR scored beside the arms, never staged")
    ap.add_argument("--max-new-tokens", type=int, default=1024, help="free_cer: as jobs.eval_ocr")
    ap.add_argument("--loop-drop-tokens", type=int, default=64, help="free_cer: with the loop's next token banned")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--stage", type=Path, default=Path("/tmp/stage"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    arms = dict(a.split("=", 1) for a in args.arm)
    models = {name: arm_model_dir(args.model_dir, Path(ckpt), args.stage / f"score_{name}")
              for name, ckpt in arms.items()}
    references = dict(r.split("=", 1) for r in args.reference)
    score, higher_is_better = RULES[args.by]
    scores, files = score(models | {name: Path(m) for name, m in references.items()}, args)
    winner = best_arm({name: scores[name] for name in arms}, higher_is_better)
    stage = stage_checkpoint(Path(arms[winner]), args.stage / "ckpt")
    (args.stage / "recipe").write_text(winner + "\n")
    result = {"arms": arms, "references": references, "by": args.by,
              "pages": [args.heldout_from, args.heldout_from + args.heldout - 1], args.by: scores, "winner": winner,
              "staged": str(stage), "scores_files": files}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
