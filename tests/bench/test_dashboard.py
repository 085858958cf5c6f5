"""bench/dashboard.py: the static performance page, rendered in headless Chromium (selenium, as
tests/e2e/test_chat_page.py does): the history charts and the latest sweep's plots are there,
drawn, and the page loads nothing from outside."""
import json
import shutil

import pytest

import dashboard


def run_of(c, scale, failed=0):
    return {"max_concurrency": c, "request_rate": "inf", "burstiness": 1.0, "num_prompts": 64, "duration": 10.0,
            "completed": 64 - failed, "failed": failed, "total_input_tokens": 8192, "total_output_tokens": 4096,
            "request_throughput": 0.5 * c * scale, "request_goodput": None, "output_throughput": 30.0 * c * scale,
            "total_token_throughput": 90.0 * c * scale, "max_output_tokens_per_s": 40.0 * c, "max_concurrent_requests": c,
            "mean_ttft_ms": 50.0 * c, "median_ttft_ms": 45.0 * c, "std_ttft_ms": 5.0, "p90_ttft_ms": 60.0 * c,
            "p99_ttft_ms": 70.0 * c, "mean_tpot_ms": 20.0 + c, "median_tpot_ms": 19.0 + c, "std_tpot_ms": 1.0,
            "p90_tpot_ms": 25.0 + c, "p99_tpot_ms": 30.0 + c, "mean_itl_ms": 20.0 + c, "median_itl_ms": 19.0 + c,
            "std_itl_ms": 1.0, "p90_itl_ms": 26.0 + c, "p99_itl_ms": 31.0 + c, "mean_e2el_ms": 1500.0, "median_e2el_ms": 1400.0,
            "std_e2el_ms": 10.0, "p90_e2el_ms": 1700.0, "p99_e2el_ms": 1800.0, "tokens_per_s_per_user": 1000 / (19.0 + c),
            "output_throughput_per_gpu": 30.0 * c * scale, "first_errors": ["HTTP 500: x"] if failed else []}


def write_results(d):
    n = 0
    for i, commit in enumerate(["aaa1111", "bbb2222", "ccc3333"]):
        for label, scale in (("kaon", 2.0 + i * 0.1), ("llamacpp", 1.0)):
            res = {"benchmark": "serve", "date": f"2026-11-{10 + i}T12:00:00", "commit": commit, "machine": "test-box: 2 cores",
                   "model": "SmolLM2-135M-Instruct.Q4_1", "label": label, "backend": "openai", "endpoint": "/v1/completions",
                   "command": f"kaon bench serve --base-url http://127.0.0.1:8000 --label {label}", "random_input_len": 128,
                   "random_output_len": 64, "random_prefix_len": 0, "num_gpus": 1,
                   "runs": [run_of(c, scale, failed=1 if (label == "llamacpp" and c == 16) else 0) for c in (1, 4, 16)]}
            (d / f"serve-{label}-{i}.json").write_text(json.dumps(res))
            n += 1
        (d / f"throughput-{i}.json").write_text(json.dumps({
            "benchmark": "throughput", "date": f"2026-11-{10 + i}T13:00:00", "commit": commit, "machine": "test-box",
            "model": "SmolLM2-135M-Instruct.Q4_1.gguf", "device": "cpu", "command": "kaon bench throughput", "input_len": 128,
            "output_len": 128, "num_requests": 64, "requests_per_second": 3.0 + i, "output_tokens_per_second": 400.0 + 10 * i}))
        (d / f"latency-{i}.json").write_text(json.dumps({
            "benchmark": "latency", "date": f"2026-11-{10 + i}T14:00:00", "commit": commit, "machine": "test-box",
            "model": "SmolLM2-135M-Instruct.Q4_1.gguf", "device": "cpu", "command": "kaon bench latency",
            "results": [{"batch_size": b, "avg_latency": 0.5 * b, "avg_decode_step_ms": 4.0 + b} for b in (1, 8)]}))
    (d / "unrelated.json").write_text(json.dumps({"tokenizer": "x"}))  # other benchmarks' files are skipped
    return n


def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.fail("selenium is missing: pip install -r scripts/requirements-test.txt")
    chrome = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not chrome or not driver:
        pytest.fail("headless Chromium is missing: apt-get install chromium chromium-driver")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--allow-file-access-from-files"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service(driver), options=opts)


def test_dashboard_in_browser(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    write_results(results)
    out = tmp_path / "perf" / "index.html"
    dashboard.build(results, out, out.parent)
    page = out.read_text()
    # self-contained: no scripts, stylesheets or images from anywhere else
    assert "<script" not in page and "<link" not in page
    assert 'src="http' not in page and "@import" not in page
    pngs = sorted(p.name for p in out.parent.glob("*.png"))
    assert len(pngs) == 5 and all(p.startswith("sweep-SmolLM2-135M-Instruct.Q4_1-in128-out64-") for p in pngs)

    from selenium.webdriver.common.by import By
    d = browser()
    try:
        d.get(out.as_uri())
        assert d.title == "kaon performance"
        assert d.find_element(By.TAG_NAME, "h1").text == "kaon performance"
        # history over commits: 9 serving metrics + 2 offline throughput + 2 offline latency
        charts = d.find_elements(By.CSS_SELECTOR, "figure.history svg.chart")
        metrics = [c.get_attribute("data-metric") for c in charts]
        for m in ("output_throughput", "request_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
                  "median_itl_ms", "median_e2el_ms", "failed", "output_tokens_per_second", "avg_decode_step_ms"):
            assert m in metrics, m
        assert len(charts) == 13
        for c in charts:
            assert c.size["width"] > 300 and c.size["height"] > 200
        # every serving series (2 servers x 3 concurrencies) is a line through 3 commits
        thr = d.find_element(By.CSS_SELECTOR, 'svg.chart[data-metric="output_throughput"]')
        assert len(thr.find_elements(By.TAG_NAME, "polyline")) == 6
        assert len(thr.find_elements(By.TAG_NAME, "circle")) == 18
        tips = [t.get_attribute("textContent") for t in thr.find_elements(By.TAG_NAME, "title")]
        assert any("kaon c=16" in t and "ccc3333" in t for t in tips)
        assert "ccc3333" in thr.get_attribute("textContent")  # the commits label the x axis
        # the latest sweep's plots, drawn from embedded PNGs
        imgs = d.find_elements(By.CSS_SELECTOR, "figure.sweep img.plot")
        assert len(imgs) == 4
        for img in imgs:
            assert img.get_attribute("src").startswith("data:image/png;base64,")
            assert d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img) > 300
        caps = " ".join(f.text for f in d.find_elements(By.CSS_SELECTOR, "figure.sweep figcaption"))
        for kind in ("throughput", "ttft", "tpot", "interactivity"):
            assert f"{kind}.png" in caps
        # the latest figures table shows the failures, and the page loaded no resource
        assert d.find_elements(By.CSS_SELECTOR, "td.bad")
        assert d.execute_script("return performance.getEntriesByType('resource').length") == 0
        assert "kaon bench serve --base-url" in d.find_element(By.TAG_NAME, "body").text
    finally:
        d.quit()


def test_dashboard_without_results(tmp_path):
    out = dashboard.build(tmp_path, tmp_path / "index.html", tmp_path)
    assert "No results yet" in out.read_text()
