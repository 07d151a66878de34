"""The live gauges over real HTTP: set on a schedule off the request path (a scrape never reaches the feedback store,
however many rows it holds), recovered with the store without traffic, following the store's retention, attributed
to feedback clients, and fed only by the feedback keys when the server has them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import SecretStr, ValidationError

from service.config import Settings
from tests.service.conftest import metric_value, random_pixels, serve, settings_for, wait_for

TINY = {"model": "tiny", "version": "1"}


def predict(url: str, n: int, headers: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    pixels = random_pixels(np.random.default_rng(n), n)
    response = httpx.post(f"{url}/predict", json={"inputs": [{"pixels": p} for p in pixels], **extra},
                          headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def scrape(url: str) -> str:
    response = httpx.get(f"{url}/metrics", timeout=30)
    assert response.status_code == 200
    return response.text


def test_a_scrape_never_reaches_the_feedback_store(tiny_repository: Path, tmp_path: Path) -> None:
    """With the schedule far off, 50 scrapes make no store call; the gauges still show what /feedback set."""
    settings = settings_for(tiny_repository, tmp_path, live_refresh_s=3600.0)
    with serve(settings) as server:
        out = predict(server.url, 4)
        for index in range(4):
            label = out["predictions"][index]["label"]
            assert httpx.post(f"{server.url}/feedback", json={"id": out["id"], "index": index, "label": label},
                              timeout=30).status_code == 200
        store = server.app_state.feedback
        reached: list[str] = []
        for name in ("_labelled", "_levels", "_window", "_labelled_versions", "_count", "_prune"):
            original = getattr(store, name)
            setattr(store, name, lambda *args, _name=name, _original=original: reached.append(_name) or _original(
                *args))
        texts = [scrape(server.url) for _ in range(50)]
        assert reached == []
        assert all(metric_value(text, "director_live_accuracy_ratio", **TINY) == 1.0 for text in texts)


def test_a_store_that_recovers_is_marked_up_without_traffic(tiny_repository: Path, tmp_path: Path) -> None:
    settings = settings_for(tiny_repository, tmp_path, live_refresh_s=0.2, feedback_retry_s=0.2)
    with serve(settings) as server:
        connection = server.app_state.feedback._conn
        connection.execute("PRAGMA query_only = ON")  # the file turned read-only under the server
        predict(server.url, 2)  # its log cannot be written
        wait_for(lambda: metric_value(scrape(server.url), "director_feedback_store_up") == 0.0,
                 "the store to be marked failing", timeout_s=30, poll_s=0.05)
        connection.execute("PRAGMA query_only = OFF")
        wait_for(lambda: metric_value(scrape(server.url), "director_feedback_store_up") == 1.0,
                 "the schedule's read to find the store back", timeout_s=30, poll_s=0.05)


def test_the_gauges_follow_the_stores_retention(tiny_repository: Path, tmp_path: Path) -> None:
    """A version whose labelled rows aged out reports no labels: its live series go, with no traffic to prune."""
    settings = settings_for(tiny_repository, tmp_path, live_refresh_s=0.2, feedback_max_age_s=2.0)
    with serve(settings) as server:
        out = predict(server.url, 1, coverage=0.9)
        label = out["predictions"][0]["label"]
        assert httpx.post(f"{server.url}/feedback", json={"id": out["id"], "label": label}, timeout=30).status_code \
            == 200
        wait_for(lambda: metric_value(scrape(server.url), "director_live_coverage_count", **TINY, coverage="0.9")
                 == 1.0, "the coverage gauge", timeout_s=30, poll_s=0.05)
        wait_for(lambda: "director_live_accuracy_ratio{" not in scrape(server.url)
                 and "director_live_coverage_count{" not in scrape(server.url), "the aged-out series to go",
                 timeout_s=30, poll_s=0.1)


def test_feedback_keys_of_their_own_name_the_client_of_every_label(tiny_repository: Path, tmp_path: Path) -> None:
    """With feedback keys, /feedback takes only them (not the API key), they open nothing else, and each label counts
    for its key's name: two labellers are two clients, and the level's robust reading is exported."""
    keys = {"labeller": SecretStr("feedback-one"), "auditor": SecretStr("feedback-two")}
    settings = settings_for(tiny_repository, tmp_path, api_key=SecretStr("api"), feedback_keys=keys,
                            live_refresh_s=0.2)
    api, one, two = ({"Authorization": f"Bearer {key}"} for key in ("api", "feedback-one", "feedback-two"))
    with serve(settings) as server:
        out = predict(server.url, 4, headers=api, coverage=0.9)
        labels = [p["label"] for p in out["predictions"]]

        def send(index: int, headers: dict[str, str]) -> httpx.Response:
            return httpx.post(f"{server.url}/feedback", json={"id": out["id"], "index": index,
                                                              "label": labels[index]}, headers=headers, timeout=30)

        assert send(0, api).status_code == 401
        assert httpx.post(f"{server.url}/predict", json={"inputs": []}, headers=one, timeout=30).status_code == 401
        assert [send(index, one if index < 2 else two).status_code for index in range(4)] == [200] * 4
        wait_for(lambda: metric_value(scrape(server.url), "director_live_coverage_clients", **TINY, coverage="0.9")
                 == 2.0, "both clients in the coverage window", timeout_s=30, poll_s=0.05)
        text = scrape(server.url)
        assert metric_value(text, "director_live_feedback_clients", **TINY) == 2.0
        # every label right: no reading without a client is more favourable than the whole window
        assert metric_value(text, "director_live_coverage_robust_count", **TINY, coverage="0.9") == 4.0
        assert metric_value(text, "director_feedback_min_clients") == 1.0  # named labellers: one may alert


def test_feedback_keys_come_from_json_or_a_file_and_bad_ones_stop_the_server(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIRECTOR_FEEDBACK_KEYS", '{"labeller": "k1"}')
    assert Settings().feedback_keys["labeller"].get_secret_value() == "k1" and Settings().alert_min_clients == 1
    monkeypatch.setenv("DIRECTOR_FEEDBACK_KEYS", "")  # compose passing an unset variable: none
    assert Settings().feedback_keys == {} and Settings().alert_min_clients == 2
    keys = tmp_path / "keys"
    keys.write_text("# labellers\nlabeller: k1\nauditor:k2\n")
    assert set(Settings(feedback_keys_file=keys).feedback_keys) == {"labeller", "auditor"}
    for text, reason in (("labeller k1\n", "expected 'name:key'"), ("a:k\na:k2\n", "expected 'name:key'"),
                         ("# nothing\n", "names no key"), ("a:\n", "non-empty key"), ("a:k\nb:k\n", "same key")):
        keys.write_text(text)
        with pytest.raises(ValidationError, match=reason):
            Settings(feedback_keys_file=keys)
    monkeypatch.setenv("DIRECTOR_FEEDBACK_KEYS", "labeller=k1")
    with pytest.raises(ValidationError, match="JSON object"):
        Settings()


def test_a_scrape_flood_shares_one_body_a_second(tiny_repository: Path, tmp_path: Path) -> None:
    """Sixty concurrent scrapes are answered from a handful of bodies (one per metrics_max_age_s, made off the event
    loop), and a prediction made meanwhile is not held behind them; the next body made shows it."""
    settings = settings_for(tiny_repository, tmp_path, metrics_max_age_s=30.0)
    with serve(settings) as server:
        state = server.app_state
        made: list[float] = []
        original = state.metrics_body
        state.exposition._make = lambda: made.append(1) or original()  # type: ignore[method-assign]
        before = scrape(server.url)
        with ThreadPoolExecutor(8) as pool:
            texts = list(pool.map(lambda _: scrape(server.url), range(60)))
        assert len(made) == 1 and all(text == before for text in texts)  # within 30 s: the same body
        predict(server.url, 1)
        state.exposition.max_age_s = 0.0
        assert metric_value(scrape(server.url), "director_predictions_total", **TINY) == 1.0 and len(made) == 2
