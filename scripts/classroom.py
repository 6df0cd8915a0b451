"""A classroom on one machine: N learners at once on one explorer, each doing what a learner does, measured from
outside: Step latency, how long the last learner waits, timeouts, whether any learner's text differs from the same
settings run alone, and the server's memory per session and after the learners have left.

    .venv/bin/python scripts/classroom.py                                  # 30 learners, embedded pair
    .venv/bin/python scripts/classroom.py --concurrency 2                  # the queue's concurrency for this run
    .venv/bin/python scripts/classroom.py --compare-concurrency 0          # Compares in the common lane
    .venv/bin/python scripts/classroom.py --zerogpu --pair tiny-random     # under the ZeroGPU double
    .venv/bin/python scripts/classroom.py --class-mode --learners 30 --json class.json   # a class follows one run

The server is app.py in its own process (scripts/soak_server.py: app.py plus memory probes), the queue as the app
configures it (--concurrency overrides app.QUEUE_CONCURRENCY for the run); every learner is a gradio_client session
(one browser tab) in a thread of this process, talking HTTP through the queue. A learner: Step, Step, Run (as the
page runs it: one queued event per step until the end; the page's paced Run is not in the API, /step does the
same work), scrub back to step 1, Compare once, a follow-up message and one Step of its answer. Every request
waits at most --timeout seconds. The learners share --configs settings (prompt, method), so the text of each is
checked against that configuration run alone first, on the same server, by one learner at a time (which also
gives the Step latency of a learner alone).

--zerogpu serves the app under the ZeroGPU double (tests/zerogpu_double: every GPU call in a forked child,
arguments and results pickled) and counts the GPU calls (per learner: the calls over the learners).

--class-mode measures a class instead (ui/classroom.py): one lecturer (a gradio_client session, as the lecturer's
page) starts a class and takes --rounds steps; once a step's answers are in the lecturer opens a second vote (peer
instruction; --no-second-vote: none), and once those are in reveals it. N learners (soak.ClassLearner: plain HTTP,
as the learner's page talks, each polling at the page's interval from its own thread) join, answer each vote after
a think of up to --think seconds, and a third of them reload their page once and come back with the rejoin token
their browser kept; each round an impostor tries a classmate's name and a forger a made-up token. It writes (to
--json) how long a Step, a second vote or a Reveal took to reach each learner's page, from the moment the class
changed on the server (`step_to_learner_*`: the lecturer's key, watched without the queue every WATCH_S) and from
the lecturer's click (`click_to_learner_*`: with the model's step and the lecturer's gradio_client round trip), the
answers acknowledged in each vote (`answers_expected`) and those the class's CSV results hold (`answers_counted`),
`lost` (answers not counted, or not found after a rejoin), `impostors_refused` of `impostors`, the server's memory
per learner and its CPU time.
"""
from __future__ import annotations

import argparse
import collections
import csv
import io
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# this folder (a script's folder is on sys.path); soak sets the environment first
from soak import (
    REPO,
    ClassLearner,
    free_port,
    impostors,
    probe_server,
    process_cpu_s,
    stop_server,
    wait_until_up,
)

STATUS = 7
CONFIGS = [  # (prompt, settings): learner i takes CONFIGS[i % len(CONFIGS)]
    ("Explain what a binary search tree is.", dict(method="mcsd", k_config="2,1,1,1")),
    ("Write a haiku about the sea.", dict(method="sd", gamma=4)),
    ("What is the capital of France? Answer in one sentence.", dict(method="ar")),
    ("List three uses of a hash map.", dict(method="pld")),
]
FOLLOW_UP = "Say it again in fewer words."


class Learner:
    """One browser tab: its requests, each timed from the click to the answer."""

    def __init__(self, url: str, timeout_s: float, controls: dict, prompt: str) -> None:
        from gradio_client import Client

        self.client = Client(url, verbose=False)
        self.timeout_s, self.controls, self.prompt = timeout_s, controls, prompt
        self.timings: list[tuple[str, float]] = []  # (action, seconds)
        self.problems: list[str] = []
        self.steps_seen: list[int] = []
        self.token_ids: list[int] | None = None

    def ask(self, action: str, *args, api_name: str, **kwargs):
        started = time.monotonic()
        job = self.client.submit(*args, api_name=api_name, **kwargs)
        try:
            result = job.result(timeout=self.timeout_s)
        except TimeoutError:
            self.timings.append((action + " (timed out)", time.monotonic() - started))
            self.problems.append(f"{action}: no answer within {self.timeout_s:.0f} s")
            raise
        self.timings.append((action, time.monotonic() - started))
        return result

    def step(self, action: str = "Step") -> str:
        status = self.ask(action, prompt=self.prompt, **self.controls, api_name="/step")[STATUS]
        if not status.startswith("✓ Step"):
            self.problems.append(f"{action}: {status[:160]!r}")
            return status
        index = int(status.split()[2])
        if self.steps_seen and index != self.steps_seen[-1] + 1 and index != 0:
            self.problems.append(f"{action}: step {index} after step {self.steps_seen[-1]}")
        self.steps_seen.append(index)
        return status

    def run_to_the_end(self) -> None:
        """Run as the page runs it: one queued event per step until the run is finished."""
        for _ in range(self.controls["max_new_tokens"] + 1):
            if "The run is finished" in self.step("Run's step") or self.problems:
                return
        self.problems.append("Run: the run did not finish")

    def saved_token_ids(self) -> list[int]:
        path, status = self.ask("save trace", api_name="/save_trace")
        if not path:
            raise RuntimeError(f"no trace saved: {status}")
        return json.loads(Path(path).read_text())["new_token_ids"]

    def lesson(self, compare: bool = True) -> None:
        """What one learner does, start to end (`compare`: with Compare, the longest request)."""
        try:
            self.step()
            self.step()
            self.run_to_the_end()
            self.token_ids = self.saved_token_ids()
            self.ask("scrub", 1, api_name="/show_step")
            if compare:
                compared = self.ask("Compare", prompt=self.prompt, **self.controls, api_name="/compare")
                if not str(compared[2]).startswith("✓"):
                    self.problems.append(f"Compare: {str(compared[2])[:160]!r}")
            status = self.ask("follow-up", FOLLOW_UP, api_name="/follow_up")[STATUS]
            if not status.startswith("✓ Turn 2"):
                self.problems.append(f"follow-up: {status[:160]!r}")
            self.steps_seen = []
            self.step("Step of the follow-up")
        except Exception as exc:  # counted; the classroom goes on
            self.problems.append(f"{type(exc).__name__}: {str(exc)[:160]}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def latency_line(name: str, values: list[float]) -> str:
    if not values:
        return f"  {name:<34} none"
    return (f"  {name:<34} p50 {percentile(values, 0.5):6.2f} s, p95 {percentile(values, 0.95):6.2f} s, "
            f"max {max(values):6.2f} s ({len(values)} requests)")


def start_server(args, probe_dir: Path, log_path: Path):
    env = {**os.environ, "SOAK_PROBE_DIR": str(probe_dir), "PYTHONUNBUFFERED": "1"}
    if args.concurrency:
        env["SOAK_QUEUE_CONCURRENCY"] = str(args.concurrency)
    if args.compare_concurrency is not None:
        env["SOAK_COMPARE_CONCURRENCY"] = str(args.compare_concurrency)
    if args.zerogpu:
        env.update(SPACES_ZERO_GPU="1", ZEROGPU_DOUBLE_LOG=str(probe_dir / "gpu_calls.jsonl"),
                   PYTHONPATH=os.pathsep.join([str(REPO / "tests" / "zerogpu_double"), str(REPO)]))
    port = free_port()
    with open(log_path, "w") as log:
        server = subprocess.Popen([sys.executable, str(REPO / "scripts" / "soak_server.py"), "--pair", args.pair,
                                   "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)], env=env,
                                  cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    return server, f"http://127.0.0.1:{port}/"


def gpu_calls(probe_dir: Path) -> list[dict]:
    path = probe_dir / "gpu_calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, default=30)
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="each run's token budget")
    parser.add_argument("--configs", type=int, default=len(CONFIGS), help=f"settings shared out (1-{len(CONFIGS)})")
    parser.add_argument("--concurrency", type=int, default=0, help="the queue's concurrency (default: the app's)")
    parser.add_argument("--compare-concurrency", type=int, default=None,
                        help="Compares at a time in their own lane (default: the app's; 0: no lane of their own)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a request may wait for its answer")
    parser.add_argument("--zerogpu", action="store_true", help="serve under the ZeroGPU double, count GPU calls")
    parser.add_argument("--settle", type=float, default=35.0,
                        help="seconds after the learners leave before the last memory probe (the app returns "
                             "freed heap to the OS every 30 s)")
    parser.add_argument("--class-mode", action="store_true",
                        help="a class: one lecturer's run on every learner's page, answers and reveals (see above)")
    parser.add_argument("--rounds", type=int, default=4, help="--class-mode: steps the lecturer shows and reveals")
    parser.add_argument("--think", type=float, default=2.0, help="--class-mode: a learner answers within this many s")
    parser.add_argument("--json", default="", help="--class-mode: write the figures to this file as JSON")
    parser.add_argument("--no-second-vote", dest="second_vote", action="store_false",
                        help="--class-mode: reveal after the first vote (no peer-instruction second vote)")
    args = parser.parse_args(argv)
    if args.class_mode:
        return class_mode(args)
    configs = CONFIGS[:max(1, min(args.configs, len(CONFIGS)))]
    probe_dir = Path(tempfile.mkdtemp(prefix="dynasd-classroom-"))
    server, url = start_server(args, probe_dir, probe_dir / "server.log")
    started = time.monotonic()
    try:
        wait_until_up(url, server)
        solo_ids, solo_steps = [], []
        for prompt, options in configs:  # alone, one after another: the reference texts and Step latency
            alone = Learner(url, args.timeout, dict(pair=args.pair, max_new_tokens=args.max_new_tokens, **options),
                            prompt)
            alone.step()
            alone.step()
            alone.run_to_the_end()
            if alone.problems:
                sys.exit(f"the configuration {options} fails alone: {alone.problems}")
            solo_ids.append(alone.saved_token_ids())
            solo_steps += [s for a, s in alone.timings if a in ("Step", "Run's step")]
            alone.client.close()
        calls_before = len(gpu_calls(probe_dir))
        before = probe_server(server, probe_dir, 0)
        learners = [Learner(url, args.timeout, dict(pair=args.pair, max_new_tokens=args.max_new_tokens,
                                                    **configs[i % len(configs)][1]), configs[i % len(configs)][0])
                    for i in range(args.learners)]
        finished: list[float] = [0.0] * args.learners
        gate = threading.Barrier(args.learners)
        class_start = [0.0]

        def attend(i: int) -> None:
            gate.wait()
            if i == 0:
                class_start[0] = time.monotonic()
            learners[i].lesson()
            finished[i] = time.monotonic()

        threads = [threading.Thread(target=attend, args=(i,)) for i in range(args.learners)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        held = probe_server(server, probe_dir, 1)
        calls = gpu_calls(probe_dir)[calls_before:]
        for learner in learners:
            learner.client.close()  # the tabs are closed: their sessions are abandoned, never ended
        time.sleep(args.settle)
        after = probe_server(server, probe_dir, 2)
    finally:
        stop_server(server)
    return report(args, configs, solo_ids, solo_steps, learners, finished, class_start[0], (before, held, after),
                  calls, time.monotonic() - started)


def report(args, configs, solo_ids, solo_steps, learners, finished, class_start, probes, calls, wall_s) -> int:
    before, held, after = probes
    steps = [s for learner in learners for a, s in learner.timings if a == "Step"]
    run_steps = [s for learner in learners for a, s in learner.timings if a == "Run's step"]
    by_action = collections.defaultdict(list)
    for learner in learners:
        for action, seconds in learner.timings:
            by_action[action].append(seconds)
    timeouts = sum(a.endswith("(timed out)") for learner in learners for a, _ in learner.timings)
    differ = [i for i, learner in enumerate(learners)
              if learner.token_ids is not None and learner.token_ids != solo_ids[i % len(configs)]]
    unchecked = sum(learner.token_ids is None for learner in learners)
    problems = [(i, p) for i, learner in enumerate(learners) for p in learner.problems]
    ends = sorted(t - class_start for t in finished if t)
    per_session = (held["rss_mb"] - before["rss_mb"]) / max(1, len(learners))
    mode = "under the ZeroGPU double" if args.zerogpu else "on the CPU"
    print()
    print(f"DynaSD Explorer classroom: {len(learners)} learners at once, {args.pair} pair {mode}, queue concurrency "
          f"{args.concurrency or 'as the app sets it'}, Compare lane "
          f"{'as the app sets it' if args.compare_concurrency is None else args.compare_concurrency or 'none'}, "
          f"{args.max_new_tokens} new tokens a run, "
          f"{len(configs)} settings ({', '.join(o['method'] for _, o in configs)})")
    print(latency_line("Step, a learner alone", solo_steps))
    print(latency_line("Step (the two Steps)", steps))
    print(latency_line("Step of a Run (one event a step)", run_steps))
    for action in ("scrub", "Compare", "follow-up", "Step of the follow-up"):
        print(latency_line(action, by_action.get(action, [])))
    if ends:
        print(f"  learners done after                first {ends[0]:.0f} s, median {statistics.median(ends):.0f} s, "
              f"last {ends[-1]:.0f} s")
    print(f"  requests timed out (> {args.timeout:.0f} s)       {timeouts}")
    print(f"  texts that differ from alone       {len(differ)} of {len(learners) - unchecked} (token ids)"
          + (f"; {unchecked} not checked" if unchecked else ""))
    print(f"  server RSS (MB, after gc)          before {before['rss_mb']:.0f}; {len(learners)} sessions held "
          f"{held['rss_mb']:.0f} ({per_session:+.1f} a session); tabs closed, {args.settle:.0f} s later "
          f"{after['rss_mb']:.0f}; sessions in the registry {after['stores'].get('registry')}")
    if args.zerogpu:
        kinds = collections.Counter(call["function"] for call in calls)
        print(f"  GPU calls                          {len(calls)}, {len(calls) / max(1, len(learners)):.1f} a "
              f"learner: " + ", ".join(f"{n} {name}" for name, n in kinds.most_common()))
    print(f"  wall time                          {wall_s:.0f} s")
    print(f"  problems                           {len(problems)}")
    for i, problem in problems[:20]:
        print(f"   - learner {i}: {problem}")
    return 1 if problems or differ or timeouts else 0


CLASS_PROMPT = "Explain what a binary search tree is."


class Pupil(ClassLearner):
    """A learner of the measured class: polls at the page's interval in its own thread, answers each new round and
    each second vote after a think, reloads its page once (when `reloads`) after answering the second round, and
    keeps what it saw."""

    def __init__(self, url, code, name, poll_s, think_s, seed, reloads) -> None:
        super().__init__(url, code, name, poll_s)
        self.rng = random.Random(seed)
        self.think_s, self.reloads, self.reloaded = think_s, reloads, False
        self.acked: dict[tuple[int, int], int] = {}     # (round, vote) -> the answer the page acknowledged
        self.problems: list[str] = []
        self.lost: list[str] = []
        self.stop = threading.Event()

    def attend(self) -> None:
        self.join()
        next_tick = time.monotonic() + self.rng.uniform(0, self.poll_s)  # pages do not tick in step
        answer_at = None
        while not self.stop.is_set():
            time.sleep(max(0.0, next_tick - time.monotonic()))
            next_tick += self.poll_s
            try:
                if self.poll() and self.frame()[1] == "asking" and (self.round, self.vote()) not in self.acked:
                    answer_at = time.monotonic() + self.rng.uniform(0.2, self.think_s)
                if answer_at is not None and time.monotonic() >= answer_at:
                    answer_at = None
                    self.answer_once()
            except Exception as exc:  # counted; the learner goes on
                self.problems.append(f"{type(exc).__name__}: {str(exc)[:160]}")

    def answer_once(self) -> None:
        number, vote, value = self.round, self.vote(), self.rng.choice(self.choices)
        if self.answer(value).startswith("✓"):
            self.acked[number, vote] = value
        elif "closed at its reveal" not in self.status:
            self.problems.append(f"round {number}: {self.status[:160]!r}")
        if self.reloads and number == 2 and vote == 1 and not self.reloaded:
            self.reloaded = True
            self.reload()
            self.poll()
            if self.mine() != str(value):
                self.lost.append(f"round {number}: after the reload the page shows {self.mine()!r}, not {value}")


def class_mode(args) -> int:
    from gradio_client import Client

    from ui.classroom import POLL_S  # the learner's page's own interval (the checkout's ui/, as the server's)

    probe_dir = Path(tempfile.mkdtemp(prefix="dynasd-class-"))
    server, url = start_server(args, probe_dir, probe_dir / "server.log")
    started, events, problems = time.monotonic(), [], []
    try:
        wait_until_up(url, server)
        lecturer = Client(url, verbose=False)
        controls = dict(pair=args.pair, max_new_tokens=max(args.max_new_tokens, args.rounds + 1))
        lecturer.predict(CLASS_PROMPT, **controls, api_name="/step")  # the model loaded, the run's prefill done
        first = lecturer.predict(api_name="/class_start")
        code, token = first[3], first[4]
        watch = ClassLearner(url, code, "the lecturer's watch")  # reads the lecturer's key without the queue
        before, cpu_before = probe_server(server, probe_dir, 0), process_cpu_s(server.pid)
        pupils = [Pupil(url, code, f"learner {i}", POLL_S, args.think, i, reloads=i % 3 == 0)
                  for i in range(args.learners)]
        threads = [threading.Thread(target=pupil.attend, daemon=True) for pupil in pupils]
        for thread in threads:
            thread.start()
        wait_for(lambda: answers_key(watch, code, token)[1] == args.learners, 60, "every learner joined", problems)
        class_start = time.monotonic()
        impostors = []
        for r in range(1, args.rounds + 1):
            events.append(timed(lecturer, watch, "step", r, "asking", 1, code, token, CLASS_PROMPT, **controls,
                                api_name="/class_step"))
            wait_for(lambda r=r: all(p.shown.get((r, "asking", 1)) for p in pupils), 30, f"round {r} shown",
                     problems)
            impostors.append(impostor_refused(url, code, pupils[r % len(pupils)].name, r))
            votes = (1, 2) if args.second_vote else (1,)
            for vote in votes:
                if vote == 2:
                    events.append(timed(lecturer, watch, "second vote", r, "asking", 2, code, token,
                                        api_name="/class_second_vote"))
                wait_for(lambda r=r, v=vote: sum((r, v) in p.acked for p in pupils) == args.learners,
                         30 + args.think, f"round {r}'s answers (vote {vote})", problems)
            if r == 1:
                held = probe_server(server, probe_dir, 1)  # every learner joined, polling, answered
            events.append(timed(lecturer, watch, "reveal", r, "revealed", votes[-1], code, token,
                                api_name="/class_reveal"))
            wait_for(lambda r=r, v=votes[-1]: all(p.shown.get((r, "revealed", v)) for p in pupils), 30,
                     f"round {r} revealed", problems)
        class_s = time.monotonic() - class_start
        cpu_s = process_cpu_s(server.pid) - cpu_before
        results = downloaded(lecturer.predict(code, token, False, api_name="/class_results")[-1])
        summary = lecturer.predict(code, token, api_name="/class_end")[2]
        for pupil in pupils:
            pupil.stop.set()
        for thread in threads:
            thread.join(10)
    finally:
        stop_server(server)
    return class_report(args, pupils, events, summary, results, impostors, (before, held), cpu_s, class_s,
                        problems, time.monotonic() - started)


def impostor_refused(url: str, code: str, classmate: str, number: int) -> bool:
    """Whether the class refuses both ways of answering as another learner (soak.impostors)."""
    refusals = [(str(act()), must_say) for act, must_say in impostors(url, code, classmate, number, 1).values()]
    return all(said.startswith("⚠") and must_say in said for said, must_say in refusals)


def downloaded(file) -> str:
    """The text of a file the lecturer's page offers (gradio_client gives the file's update, or its path)."""
    while isinstance(file, dict):
        file = file.get("value") or file.get("path")
    return Path(file).read_text(encoding="utf-8")


def counted_answers(results_csv: str) -> int:
    """Every answer of both votes the class's CSV results hold."""
    rows = [row for row in csv.DictReader(io.StringIO(results_csv)) if row["kind"] == "answer"]
    return sum(bool(row["first_vote"]) + bool(row["second_vote"]) for row in rows)


def timed(lecturer, watch: ClassLearner, action: str, number: int, phase: str, vote: int, *args, api_name: str,
          **kwargs) -> dict:
    """The lecturer's action, timed: its click, the moment the class changed on the server (the lecturer's key,
    watched without the queue every WATCH_S from the click) and the lecturer's answer."""
    code, token = args[0], args[1]
    before = watch.call("class_answers", None, code, token)[0]
    clicked = time.monotonic()
    job = lecturer.submit(*args, api_name=api_name, **kwargs)
    changed = None
    while changed is None and not job.done():
        if watch.call("class_answers", None, code, token)[0] != before:
            changed = time.monotonic()
        else:
            time.sleep(WATCH_S)
    said = str(job.result()[-3])
    answered = time.monotonic()
    return dict(action=action, round=number, phase=phase, vote=vote, clicked=clicked, changed=changed or answered,
                answered=answered, said=said)


WATCH_S = 0.02


def answers_key(watch: ClassLearner, code: str, token: str) -> tuple[int, int]:
    """(version, learners joined) from the lecturer's poll (ui/classroom.py lecturer_key)."""
    parts = str(watch.call("class_answers", None, code, token)[0]).split(".")
    return (int(parts[1]), int(parts[2])) if len(parts) == 4 else (0, 0)


def wait_for(done, timeout_s: float, what: str, problems: list[str]) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            problems.append(f"{what}: not within {timeout_s:.0f} s")
            return
        time.sleep(0.05)


def class_report(args, pupils, events, summary, results, impostors, probes, cpu_s, class_s, problems, wall_s) -> int:
    before, held = probes
    delays, clicks, by_action = [], [], collections.defaultdict(list)
    for event in events:
        for pupil in pupils:
            seen = pupil.shown.get((event["round"], event["phase"], event["vote"]))
            if seen is None:
                continue
            delays.append(seen - event["changed"])
            clicks.append(seen - event["clicked"])
            by_action[event["action"]].append(seen - event["changed"])
    expected = sum(len(p.acked) for p in pupils)
    counted = counted_answers(results)
    scored = sum(int(n) for n in re.findall(r"\d+ of (\d+) right", summary))
    if scored != len({(number, p.name) for p in pupils for number, _ in p.acked}):
        problems = problems + [f"the summary scores {scored} answers, not one per learner and round answered"]
    missing = sum(1 for event in events for p in pupils
                  if (event["round"], event["phase"], event["vote"]) not in p.shown)
    lost = [f"{p.name}: {line}" for p in pupils for line in p.lost]
    if missing:
        lost.append(f"{missing} time(s) a learner's page never showed a step or a reveal")
    problems = problems + [f"{p.name}: {line}" for p in pupils for line in p.problems]
    lecturer_s = [e["answered"] - e["clicked"] for e in events]
    figures = {
        "learners": len(pupils), "pair": args.pair, "rounds": args.rounds, "poll_s": pupils[0].poll_s if pupils else 0,
        "step_to_learner_p50_s": round(percentile(delays, 0.5), 3),
        "step_to_learner_p95_s": round(percentile(delays, 0.95), 3),
        "step_to_learner_max_s": round(max(delays, default=float("nan")), 3),
        "step_only_to_learner_p95_s": round(percentile(by_action["step"], 0.95), 3),
        "reveal_only_to_learner_p95_s": round(percentile(by_action["reveal"], 0.95), 3),
        "second_vote_to_learner_p95_s": round(percentile(by_action["second vote"], 0.95), 3),
        "click_to_learner_p95_s": round(percentile(clicks, 0.95), 3),
        "lecturer_request_p50_s": round(percentile(lecturer_s, 0.5), 3),
        "click_to_class_p50_s": round(percentile([e["changed"] - e["clicked"] for e in events], 0.5), 3),
        "answers_expected": expected, "answers_counted": counted,
        "lost": len(lost) + abs(expected - counted),
        "impostors": len(impostors), "impostors_refused": sum(impostors),
        "server_rss_mb_before": round(before["rss_mb"], 1), "server_rss_mb_with_learners": round(held["rss_mb"], 1),
        "memory_per_learner_mb": round((held["rss_mb"] - before["rss_mb"]) / max(1, len(pupils)), 3),
        "server_cpu_cores": round(cpu_s / class_s, 3) if class_s else None,
        "learner_requests": sum(p.requests for p in pupils),
        "reloads": sum(p.reloaded for p in pupils),
        "wall_s": round(wall_s, 1), "problems": (problems + lost)[:20],
    }
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    print(f"\nDynaSD Explorer class: {len(pupils)} learners and a lecturer, {args.pair} pair, {args.rounds} steps, "
          f"pages polling every {figures['poll_s']} s")
    for name, value in figures.items():
        if name != "problems":
            print(f"  {name:<32} {value}")
    for problem in figures["problems"]:
        print(f"   - {problem}")
    return 1 if problems or lost or expected != counted or not all(impostors) else 0


if __name__ == "__main__":
    sys.exit(main())
