"""What the recipes (apps/recipe.py, apps/recipe_code.py) keep around their stages: each stage's wall time and
the peak resident memory above its start, and the policy a stage left (the base model with the
stages' adapters merged in, in order).

    meter = StageMeter()
    with meter.stage("sft", memory=True):
        summary["sft_run"] = sft_train(...)
    meter.record(summary)   # summary["seconds"], ["peak_rss_gb"], ["memory"]

The peak is read from the process's own high-water mark (Linux /proc/self/status VmHWM), reset at the
start of each measured stage (/proc/self/clear_refs), so a stage is not charged for an earlier one's
peak. That reset moves getrusage's ru_maxrss and GNU time's figure too: the run's peak is the largest
mark seen, kept in `highest`.

A recipe too long for one sitting runs its stages through a `Progress`, which can continue it
(`--resume`): the stages that finished are read back, the one that was stopped continues from its
newest checkpoint.

    progress = Progress(out_dir, summary, resume, OUTPUTS, "recipe code")
    summary["sft_run"] = progress.stage("sft", sft_dir, lambda: sft_train(SFTConfig(
        ..., save_every=1, **progress.continued(sft_dir))), memory=True)
    progress.finish()       # summary.json, "finished": true
"""

import csv
import json
import os
import time
from contextlib import contextmanager

from safetensors import safe_open

from ..adapter_files import load_adapter
from ..files import fresh_folder
from ..lora import merge_and_unload
from ..weights import load_pretrained
from .budget import trim_heap
from .checkpoint import latest_checkpoint

# what a resumed run must share with the run it continues (keys of the recipe's summary);
# model_contents is compared where the earlier run recorded it (runs from before did not)
IDENTITY = ("model", "model_contents", "seed", "settings", "held_out_tasks")


# what a finished stage's folder must hold whole before --resume reads it back
TRAINED = (
    "run.json",
    "metrics.csv",
    "adapter/adapter_config.json",
    "adapter/adapter_model.safetensors",
)
EVALUATED = ("episodes.jsonl",)


def not_whole(path: str) -> str | None:
    """Why a file a finished stage left cannot be read whole ("missing", or what reading it
    raised: a JSON, JSONL, CSV or safetensors file cut short), or None."""
    if not os.path.isfile(path):
        return "missing"
    try:
        with open(path, encoding="utf-8", newline="") as f:
            if path.endswith(".json"):
                json.load(f)
            elif path.endswith(".jsonl"):
                for line in f:
                    json.loads(line)
            elif path.endswith(".csv"):
                # a row cut short has no value for its last columns
                if any(None in row.values() for row in csv.DictReader(f)):
                    return "cut short (a row lacks its last columns)"
        if path.endswith(".safetensors"):
            with safe_open(path, framework="pt"):
                pass
    except Exception as e:
        return f"cut short or corrupt ({type(e).__name__}: {str(e)[:80]})"
    return None


def differences(key: str, earlier, now) -> list[str]:
    """What differs between a setting's two values, one line a key ("settings.again 0.4 -> 0.9"):
    dicts key by key, so a changed setting is named, not shown as two whole dicts of 1 KB."""
    if isinstance(earlier, dict) and isinstance(now, dict):
        return [
            line
            for k in [*earlier, *(k for k in now if k not in earlier)]
            for line in differences(f"{key}.{k}", earlier.get(k), now.get(k))
        ]
    return [] if earlier == now else [f"{key} {earlier!r:.80} -> {now!r:.80}"]


def load_policy(base: str, adapters: list[str]):
    """The base model with each adapter in turn merged in: SFT's, then GRPO's (trained on the merged SFT model)."""
    model, tokenizer = load_pretrained(base)
    for folder in adapters:
        merge_and_unload(load_adapter(model, folder))
    return model, tokenizer


def resident(field: str) -> int:
    """VmRSS (resident now) or VmHWM (its high-water mark) of this process, in bytes; 0 off Linux."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))
    except OSError:
        return 0


class StageMeter:
    """Wall time per stage, and for the training stages the peak resident memory above the stage's
    start, in bytes (what the memory guard's estimate for that stage is compared with)."""

    def __init__(self):
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.peaks: dict[str, int] = {}
        # each measured stretch's high-water mark: the run's peak is the largest
        self.highest: list[int] = []

    @contextmanager
    def stage(self, name: str, memory: bool = False):
        tick = time.perf_counter()
        floor = self._reset_peak() if memory else 0
        try:
            yield
        finally:
            # a stage that paused (recipe code --grpo-minutes) is charged its time too
            self.seconds[name] = time.perf_counter() - tick
            if memory:
                self.peaks[name] = resident("VmHWM") - floor

    def _reset_peak(self) -> int:
        """Start a new high-water mark at the current size, after handing the heap's free pages back;
        returns that size (what the stage's peak is measured above)."""
        self.highest.append(resident("VmHWM"))
        trim_heap()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        return resident("VmRSS")

    def record(self, summary: dict) -> None:
        """summary["seconds"] (each stage and the total), ["peak_rss_gb"] (the run's peak) and
        ["memory"] (each training stage's estimate, from summary[f"{stage}_run"], beside its peak)."""
        summary["seconds"] = {**self.seconds, "total": time.perf_counter() - self.start}
        summary["peak_rss_gb"] = max(self.highest + [resident("VmHWM")]) / 1e9
        summary["memory"] = {
            stage: {
                "estimate_gb": summary[f"{stage}_run"]["memory_estimate_gb"],
                "measured_gb": peak / 1e9,
            }
            for stage, peak in self.peaks.items()
        }


class Progress:
    """A recipe's stages, resumable. The summary so far is written to out_dir/summary.json
    ("finished": false) before every stage, and each stage writes its own folder whose summary.json
    comes last. With resume, a stage whose folder holds that file finished and is read back, not run
    again (its wall time and peak are the earlier run's), and a training stage stopped midway
    continues from its newest checkpoint (continued()). A run resumes only with the same model,
    seed, settings and held-out list."""

    def __init__(self, out_dir: str, summary: dict, resume: bool, owned: set[str], job: str):
        self.out_dir, self.summary, self.resume = out_dir, summary, resume
        self.path = os.path.join(out_dir, "summary.json")
        self.meter = StageMeter()
        self.earlier: dict = {}
        if resume:
            # summary.json is left as it is until the first stage runs: a resume refused on the
            # way (a stage's file cut short) changes nothing
            self.earlier = self._earlier(job)
            summary["resumes"] = self.earlier.get("resumes", 0) + 1
        else:
            fresh_folder(out_dir, owned, job)
            self.save()

    def _earlier(self, job: str) -> dict:
        """The summary.json of the run to continue, checked to be this run's."""
        if not os.path.exists(self.path):
            raise FileNotFoundError(
                f"--resume: {self.path} does not exist, so {self.out_dir} holds no {job} run to "
                "continue; drop --resume to start one"
            )
        why = not_whole(self.path)
        if why:
            raise ValueError(
                f"--resume: {self.path} is {why}, so the {job} run in {self.out_dir} cannot be "
                "read back; start it again without --resume, or in another --out"
            )
        with open(self.path) as f:
            earlier = json.load(f)
        if not isinstance(earlier, dict):
            raise ValueError(f"--resume: {self.path} holds no run's summary (not a JSON object)")
        changed = [
            line
            for key in IDENTITY
            if not (key == "model_contents" and key not in earlier)
            for line in differences(key, earlier.get(key), self.summary.get(key))
        ]
        if changed:
            raise ValueError(
                f"--resume: {self.out_dir} holds a {job} run with other settings ({'; '.join(changed)}); "
                "continue it with its own settings, or choose another --out (nothing was changed)"
            )
        return earlier

    def finished(self, folder: str, needs: tuple = ()) -> dict | None:
        """With resume, the summary.json of a stage that finished in `folder`; else None. The
        summary and each file of `needs` (paths in `folder`) must be whole: one cut short or
        missing is named, never read as done."""
        path = os.path.join(folder, "summary.json")
        if not (self.resume and os.path.exists(path)):
            return None
        for name in ("summary.json", *needs):
            why = not_whole(os.path.join(folder, name))
            if why:
                raise ValueError(
                    f"--resume: {os.path.join(folder, name)} is {why}, so the stage in {folder} "
                    "did not finish whole; remove that folder and --resume again to run the stage "
                    "again (nothing was changed)"
                )
        with open(path) as f:
            return json.load(f)

    def continued(self, folder: str) -> dict:
        """A training stage's config flags: resume=True where an earlier run left a checkpoint in
        `folder`, overwrite=True where it left the folder without one (stopped before its first
        checkpoint: its outputs go), else none (a new folder)."""
        if not (self.resume and os.path.isdir(folder)):
            return {}
        return {"resume": True} if latest_checkpoint(folder) else {"overwrite": True}

    def stage(self, name: str, folder: str, work, memory: bool = False, needs: tuple = ()) -> dict:
        """work()'s summary of stage `name`, which writes `folder`; or, resumed, the summary the
        stage left there when it finished (with `needs` whole: finished()). memory: measure the
        stage's peak (StageMeter)."""
        done = self.finished(folder, needs)
        if done is not None:
            self.meter.seconds[name] = self.earlier.get("seconds", {}).get(name, 0.0)
            peak = self.earlier.get("memory", {}).get(name)
            if peak:
                self.meter.peaks[name] = int(peak["measured_gb"] * 1e9)
            print(f"   finished earlier: read from {folder}")
            return done
        self.save()
        # the time an earlier sitting spent on this stage before it paused or stopped
        before = self.earlier.get("seconds", {}).get(name, 0.0)
        try:
            with self.meter.stage(name, memory=memory):
                return work()
        finally:
            self.meter.seconds[name] += before

    def save(self, finished: bool = False) -> None:
        """summary.json as it stands: times and peaks so far, the earlier runs' included."""
        summary = self.summary
        self.meter.record(summary)
        summary["seconds"]["total"] += self.earlier.get("seconds", {}).get("total", 0.0)
        summary["peak_rss_gb"] = max(summary["peak_rss_gb"], self.earlier.get("peak_rss_gb", 0.0))
        summary["finished"] = finished
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(summary, f, indent=2)
        os.replace(tmp, self.path)

    def finish(self) -> None:
        """The whole run's summary.json, "finished": true."""
        self.save(finished=True)
