"""The loop tests' inputs: a short single-process training config, fifty questions, rollout workers that finish
jobs in random order and sometimes die, and a one-worker source, weight push and learner that record what they do."""

from __future__ import annotations

import random
from pathlib import Path

from ziprl.config import ZipRLConfig, load_config
from ziprl.env.group import Group
from ziprl.env.trajectory import Trajectory, Turn
from ziprl.loop.source import Completion
from ziprl.retrieval.types import QAExample

QUESTIONS = [QAExample(id=f"q{i}", question=f"question {i}?", answers=[str(i)]) for i in range(50)]


TRAIN_SETS = ["rollout.group_size=2", "learner.global_batch_questions=2", "env.max_turns=2", "sampling.max_new_tokens=8",
              "model.device=cpu", "learner.beta=0.001", "data.limit=5"]


def train_cfg(model, out, steps, resume=False) -> ZipRLConfig:
    """``steps`` steps of ``python -m ziprl.train`` on CPU from ``model`` into ``out``: 2 questions of 2, 2 turns
    (``TRAIN_SETS``)."""
    return load_config(None, [f"run.sft_checkpoint={model}", f"run.out_dir={out}", f"learner.steps={steps}",
                              f"run.resume={resume}", *TRAIN_SETS])


class SimulatedSource:
    """Workers that finish jobs in random order and sometimes die mid-job (then are restarted, as Ray does)."""

    def __init__(self, workers: int, per_call: int, group_size: int, rng: random.Random, death_p: float):
        self.num_workers, self.questions_per_call = workers, per_call
        self.group_size, self.rng, self.death_p = group_size, rng, death_p
        self.version = 0  # the weights every worker has (pushed synchronously by the loop)
        self.jobs: dict[int, tuple[int, list[QAExample], int, int]] = {}
        self.generated: list[str] = []
        self.busy_workers: set[int] = set()
        self.seeds: list[tuple[int, tuple[str, ...]]] = []

    def submit(self, worker, ticket, examples, seed):
        assert worker not in self.busy_workers, "a worker was given a second job"
        assert 1 <= len(examples) <= self.questions_per_call
        self.busy_workers.add(worker)
        self.jobs[ticket] = (worker, list(examples), seed, self.version)
        self.seeds.append((seed, tuple(e.id for e in examples)))

    def wait(self):
        assert self.jobs, "wait() with nothing running would block forever"
        tickets = self.rng.sample(sorted(self.jobs), self.rng.randint(1, len(self.jobs)))
        out = []
        for t in tickets:
            worker, examples, _, version = self.jobs.pop(t)
            self.busy_workers.discard(worker)
            if self.rng.random() < self.death_p:
                out.append(Completion(t, None))
                continue
            groups = []
            for qi, ex in enumerate(examples):  # a job may hold one question twice (epoch boundary)
                gid = f"{t}:{qi}:{ex.id}"
                groups.append(Group(tuple(Trajectory(question_id=ex.id, question=ex.question, answers=ex.answers,
                                                     group_id=gid, sample_index=s, policy_version=version)
                                          for s in range(self.group_size))))
                self.generated.append(gid)
            out.append(Completion(t, groups, {"tokens": 10.0, "gen_seconds": 0.1}))
        return out


class RecordingLogger:
    """A metrics logger for the training loop's tests: keeps every (step, metrics) it is given."""

    def __init__(self):
        self.steps, self.opened = [], None

    def open(self, first_step):
        self.opened = first_step

    def log(self, step, metrics):
        self.steps.append((step, metrics))


class OneWorker:
    """A rollout source that only runs rollouts: each job returns G one-turn trajectories of the pushed version."""

    num_workers, questions_per_call = 1, 2

    def __init__(self, push: RecordingPush):
        self.push, self.jobs = push, []

    def submit(self, worker, ticket, examples, seed):
        self.jobs.append((ticket, examples))

    def wait(self):
        ticket, examples = self.jobs.pop(0)
        groups = [Group(tuple(Trajectory(question_id=ex.id, question=ex.question, answers=ex.answers,
                                         group_id=f"{ticket}.{ex.id}", sample_index=s, policy_version=self.push.version,
                                         reward=float(s), turns=[Turn(prompt_ids=[1], response_ids=[2], logprobs=[-0.5])])
                              for s in range(2)))
                  for ex in examples]
        return [Completion(ticket, groups, {"tokens": 2.0, "gen_seconds": 0.1})]

    def idle_probe(self):
        running = bool(self.jobs)  # a job submitted and not yet collected counts as running
        return lambda: not running

    def close(self):
        pass


class RecordingPush:
    """A weight push that records the versions pushed (and gives :class:`OneWorker` the current one)."""

    def __init__(self):
        self.version, self.pushed = 0, []

    def push(self, version):
        self.version = version
        self.pushed.append(version)
        return {"seconds": 0.0, "bytes": 8.0}

    def close(self):
        pass


class CountingLearner:
    """A learner whose step only counts: the versions of the groups it trained on, whether rollouts were idle, and
    whether each checkpoint was written in the background."""

    def __init__(self, version=0):
        self.version, self.trained, self.idle = version, [], []

    def train_step(self, groups, rollouts_idle=None):
        self.trained.append({g.version for g in groups})
        self.idle.append(rollouts_idle())
        self.version += 1
        return {"loss": 0.0}

    def save_checkpoint(self, out_dir: Path, position, background=False):
        self.saves = [*getattr(self, "saves", []), background]
        return str(out_dir)

    def finish_writes(self):
        self.finished = getattr(self, "finished", 0) + 1

    def load_latest(self, out_dir: Path):
        return None
