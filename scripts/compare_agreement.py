"""Does Compare give the same answer twice, and the same in a browser as headless? Prints every method's ratio
against ar from two headless Compares and one Compare clicked in headless Chromium, on one prompt and the page's
default settings, with how far they agree and the machine's load around each.

    python scripts/compare_agreement.py                               # embedded pair, the page's first example
    python scripts/compare_agreement.py --pair tiny-random --screenshots /tmp/shots
    python scripts/compare_agreement.py --no-browser                  # the two headless Compares only
    python scripts/compare_agreement.py --landing 7                   # 7 headless Compares, each against the others

The app is served in this process (scripts/browser_bench.py's serve), so the headless Compares run the same code on
the same model thread as the page's, and the page's result is read from what it kept (measured_here.py). Targets:
two headless Compares' ratios within 10% of each other; the browser's within 15% of the headless ones' mean.
Other work on the machine moves every number: the load averages printed beside them say how busy it was.
With --screenshots DIR, after the Compare it runs the prompt at temperature 0 and at 0.7 and saves Compare, Summary,
Decisions and Learn → Cost model at a desktop's width and at a phone's (412 px), in colour and in greyscale.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

from browser_bench import WAIT_S, chromium, serve
from soak import process_cpu_s

REPO = Path(__file__).resolve().parent.parent
HEADLESS_TARGET, BROWSER_TARGET = 0.10, 0.15


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages (/proc/loadavg's first three fields)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())


def ratios_of(result) -> dict[str, tuple[float, float, float, float | None]]:
    """method -> (ratio, low, high, ratio by CPU time) of a CompareResult."""
    out = {}
    for row in result.rows:
        if row.method == "ar":
            out[row.method] = (1.0, 1.0, 1.0, None)
        elif row.against_ar is not None:
            paired = row.against_ar
            out[row.method] = (paired.ratio, paired.low, paired.high, paired.by_cpu)
    return out


def headless_compare(state, settings, prompt: str) -> dict:
    from dynasd.explorer.measure import compare
    from dynasd.explorer.model_thread import on_the_model_thread

    before, started = load_average(), time.perf_counter()
    final = on_the_model_thread(lambda: list(compare.run_compare(state.PAIRS, settings, prompt))[-1])
    result = compare.compare_result(final)
    return dict(ratios=ratios_of(result), seconds=time.perf_counter() - started, load_before=before,
                load_after=load_average(), load_seen=result.load_said(), ar_tokens_per_s=next(
                    (r.tokens_per_s for r in result.rows if r.method == "ar"), None))


def browser_cpu_s() -> float:
    """The CPU time (user + system, s) of every Chromium process on the machine so far: what the page took from the
    cores the Compare measured on."""
    total = 0.0
    for process in Path("/proc").glob("[0-9]*"):
        try:
            if "chrom" in (process / "comm").read_text():
                total += process_cpu_s(int(process.name))
        except OSError:  # it ended meanwhile
            continue
    return total


def tab(driver, name: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    button = WebDriverWait(driver, WAIT_S).until(
        lambda d: next((b for b in d.find_elements(By.CSS_SELECTOR, "button[role=tab]")
                        if b.get_attribute("textContent").strip() == name), None))
    driver.execute_script("arguments[0].scrollIntoView(); arguments[0].click()", button)


def browser_compare(driver, url: str, pair: str, prompt: str) -> dict:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    from dynasd.device_info import machine_line
    from dynasd.explorer.measure.measured_here import prompt_key, read_compares

    wait = WebDriverWait(driver, 20 * WAIT_S, poll_frequency=0.5)  # polled slowly: the page shares the cores
    driver.get(url)
    wait.until(ready.element_to_be_clickable((By.ID, "step-btn")))
    tab(driver, "Compare")
    before, started, cpu_before = load_average(), time.perf_counter(), browser_cpu_s()
    wait.until(ready.element_to_be_clickable((By.ID, "compare-btn"))).click()
    wait.until(lambda d: "all methods compared" in d.find_element(By.ID, "compare-status").text.lower())
    seconds, browser_cpu = time.perf_counter() - started, browser_cpu_s() - cpu_before
    kept = next(k for k in read_compares(machine_line(), pair) if k.prompt_key == prompt_key(prompt))
    ratios = {r.method: (1.0, 1.0, 1.0, None) if r.method == "ar" else (r.ratio, r.ratio_low, r.ratio_high, None)
              for r in kept.rows if r.method == "ar" or r.ratio is not None}
    return dict(ratios=ratios, seconds=seconds, load_before=before, load_after=load_average(), load_seen=kept.load,
                ar_tokens_per_s=kept.row("ar").tokens_per_s if kept.row("ar") else None, browser_cpu_s=browser_cpu)


TEMPERATURES = ("0", "0.7")
VIEWS = (("compare", "Compare", "compare-plot"), ("summary", "Summary", "summary"),
         ("decisions", "Decisions", "pq-plot"), ("cost-model", "Cost model", "learn-cost-text"))


def set_temperature(driver, value: str) -> None:
    """Type `value` into the temperature slider's number box (in the Sampling accordion, opened first)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    boxes = driver.find_elements(By.CSS_SELECTOR, "#temperature input[type=number]")
    if not (boxes and boxes[0].is_displayed()):  # a closed accordion draws its controls only once opened
        accordion = next(b for b in driver.find_elements(By.CSS_SELECTOR, "button, .label-wrap")
                         if b.text.strip().startswith("Sampling"))
        driver.execute_script("arguments[0].scrollIntoView(); arguments[0].click()", accordion)
        time.sleep(1.0)
    box = driver.find_element(By.CSS_SELECTOR, "#temperature input[type=number]")
    driver.execute_script("arguments[0].scrollIntoView()", box)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(value, Keys.TAB)
    time.sleep(0.5)


def screenshots(driver, folder: Path) -> list[str]:
    """For a run of the prompt at temperature 0 and at 0.7: Compare, Summary, Decisions and Learn → Cost model at
    1600 px and at 412 px, in colour and in greyscale (CSS grayscale on the whole page)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, 20 * WAIT_S, poll_frequency=0.5)
    folder.mkdir(parents=True, exist_ok=True)
    saved = []
    for temperature in TEMPERATURES:
        driver.set_window_size(1600, 2200)
        set_temperature(driver, temperature)
        before = driver.find_element(By.ID, "status").text
        driver.find_element(By.ID, "run-btn").click()
        wait.until(lambda d, before=before: "Done after" in d.find_element(By.ID, "status").text
                   and d.find_element(By.ID, "status").text != before)
        costed = False
        for width, height in ((1600, 2200), (412, 2400)):
            driver.set_window_size(width, height)
            for grey in (False, True):
                driver.execute_script(f"document.documentElement.style.filter = '{'grayscale(1)' if grey else ''}'")
                for name, tab_name, element in VIEWS:
                    tab(driver, "Learn" if name == "cost-model" else tab_name)
                    if name == "cost-model":
                        tab(driver, tab_name)
                        if not costed:
                            shown = driver.find_element(By.ID, "learn-cost-text").text
                            driver.find_element(By.ID, "learn-cost-btn").click()
                            wait.until(lambda d, shown=shown: "×" in d.find_element(By.ID, "learn-cost-text").text
                                       and d.find_element(By.ID, "learn-cost-text").text != shown)
                            costed = True
                            time.sleep(1.0)
                    driver.execute_script(f"document.getElementById('{element}').scrollIntoView()")
                    time.sleep(0.5)
                    path = folder / f"t{temperature}-{name}-{width}{'-grey' if grey else ''}.png"
                    driver.save_screenshot(str(path))
                    saved.append(str(path))
        driver.execute_script("document.documentElement.style.filter = ''")
    return saved


def agreement(a: dict, b: dict) -> dict[str, float]:
    """method -> |a / b - 1| over the methods both have."""
    return {m: abs(a[m][0] / b[m][0] - 1) for m in a if m in b and m != "ar" and b[m][0] > 0}


def report(runs: dict, browser: bool, pair: str, prompt: str) -> None:
    """The table of every method's ratio in each Compare and how far they agree, then each Compare's load."""
    methods = [m for m in runs["headless 1"]["ratios"] if m != "ar"]
    names = list(runs)
    print(f"pair {pair}, prompt {prompt[:50]!r}…, default settings; ratio against ar (90% range)")
    print("| method | " + " | ".join(names) + " | headless 1 vs 2 |" + (" browser vs headless |" if browser else ""))
    print("|---" * (len(names) + 2 + browser) + "|")
    two = agreement(runs["headless 1"]["ratios"], runs["headless 2"]["ratios"])
    mean = {m: (statistics.mean([runs["headless 1"]["ratios"][m][0], runs["headless 2"]["ratios"][m][0]]),)
            for m in methods if m in runs["headless 2"]["ratios"]}
    versus = agreement(runs["browser"]["ratios"], mean) if browser else {}
    for method in methods:
        cells = []
        for name in names:
            got = runs[name]["ratios"].get(method)
            cells.append("–" if got is None else f"{got[0]:.3f} ({got[1]:.3f}–{got[2]:.3f})"
                         + (f", CPU {got[3]:.3f}" if got[3] is not None else ""))
        line = f"| {method} | " + " | ".join(cells) + f" | {two.get(method, float('nan')):.1%} |"
        print(line + (f" {versus.get(method, float('nan')):.1%} |" if browser else ""))
    for name, run in runs.items():
        print(f"{name}: {run['seconds']:.1f} s, ar {run['ar_tokens_per_s'] or 0:.1f} tokens/s; /proc/loadavg "
              f"{run['load_before']} before, {run['load_after']} after; Compare's own: {run['load_seen']}"
              + (f"; Chromium's CPU meanwhile {run['browser_cpu_s']:.1f} s ({run['browser_cpu_s'] / run['seconds']:.2f}"
                 " of a core)" if "browser_cpu_s" in run else ""))
    worst = max(two.values(), default=0.0)
    print(f"headless 1 vs 2: worst {worst:.1%} (target {HEADLESS_TARGET:.0%})"
          + (f"; browser vs headless: worst {max(versus.values(), default=0.0):.1%} (target {BROWSER_TARGET:.0%})"
             if browser else ""))


def landing(compares: list[dict]) -> None:
    """Over several headless Compares, per method: its ratios' spread, its range's mean width, how often one
    Compare's ratio lies within another's range (the page says a second Compare minutes later mostly does) and how
    many pairs of Compares have ranges that do not meet."""
    print(f"{len(compares)} headless Compares; ratio against ar")
    print("| method | ratios | mean range width | lands in another's range | pairs with disjoint ranges |")
    print("|---|---|---|---|---|")
    methods = [m for m in compares[0]["ratios"] if m != "ar"]
    for method in methods:
        got = [c["ratios"][method] for c in compares if method in c["ratios"]]
        pairs = [(a, b) for i, a in enumerate(got) for j, b in enumerate(got) if i != j]
        lands = sum(a[1] <= b[0] <= a[2] for a, b in pairs) / len(pairs) if pairs else float("nan")
        disjoint = sum(a[2] < b[1] for a, b in pairs)  # each disjoint pair counted once: the lower one first
        width = statistics.mean((high - low) / ratio for ratio, low, high, _ in got)
        print(f"| {method} | {min(r[0] for r in got):.3f}-{max(r[0] for r in got):.3f} | {width:.1%} | {lands:.0%} | "
              f"{disjoint} of {len(pairs) // 2} |")
    for i, c in enumerate(compares, 1):
        print(f"Compare {i}: {c['seconds']:.1f} s, ar {c['ar_tokens_per_s'] or 0:.1f} tokens/s, /proc/loadavg "
              f"{c['load_before']} before")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--no-browser", action="store_true", help="the two headless Compares only")
    parser.add_argument("--screenshots", default="", help="save screenshots of a run's views here")
    parser.add_argument("--json", default="", help="also write the numbers to this file")
    parser.add_argument("--landing", type=int, default=0,
                        help="instead: this many headless Compares, each read against the others' ranges")
    args = parser.parse_args(argv)
    browser = not args.no_browser
    has_chromium = (shutil.which("chromium") or shutil.which("chromium-browser")) and shutil.which("chromedriver")
    if browser and not has_chromium:
        parser.error("needs Debian chromium and chromium-driver (or --no-browser)")
    state, url, _ = serve(REPO, args.pair)
    from dynasd.explorer.inputs import Settings
    from ui.texts import EXAMPLES

    settings, prompt = Settings(pair=args.pair), EXAMPLES[0]  # the page's defaults: what its Compare runs
    if args.landing:
        compares = [headless_compare(state, settings, prompt) for _ in range(max(args.landing, 2))]
        landing(compares)
        if args.json:
            Path(args.json).write_text(json.dumps(compares, indent=2, default=str))
        sys.stdout.flush()
        threading.Timer(0.1, lambda: os._exit(0)).start()
        return
    runs = {"headless 1": headless_compare(state, settings, prompt),
            "headless 2": headless_compare(state, settings, prompt)}
    driver = chromium(1600, 1800) if browser else None
    try:
        if browser:
            runs["browser"] = browser_compare(driver, url, args.pair, prompt)
        report(runs, browser, args.pair, prompt)
        if args.json:
            Path(args.json).write_text(json.dumps(runs, indent=2, default=str))
        if browser and args.screenshots:
            for path in screenshots(driver, Path(args.screenshots)):
                print(f"screenshot: {path}")
    finally:
        if driver is not None:
            driver.quit()
    sys.stdout.flush()
    threading.Timer(0.1, lambda: os._exit(0)).start()  # the in-process server's threads would keep us alive


if __name__ == "__main__":
    main()
