"""Downloads from a local HTTP server in a thread: checksum, gunzip, broken connections,
and load_shd(download=True) (etrace_fit/datasets/download.py). No real network."""

import gzip
import hashlib
import http.server
import os
import threading

import numpy as np
import pytest

from etrace_fit.datasets import download, load_shd, shd
from etrace_fit.errors import DataError

BODY = bytes(range(256)) * 40


class Handler(http.server.BaseHTTPRequestHandler):
    files: dict = {}

    def do_GET(self):
        if self.path == "/broken":  # announces more than it sends, then closes
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY) + 5000))
            self.end_headers()
            self.wfile.write(BODY)
            self.wfile.flush()
            self.close_connection = True
            return
        body = self.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # keep the test output quiet
        pass


@pytest.fixture
def server(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)  # talk to 127.0.0.1 directly
    Handler.files = {"/good.bin": BODY, "/data.bin.gz": gzip.compress(BODY), "/bad.gz": b"not gzip at all"}
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def test_a_good_file_is_downloaded_and_its_checksum_checked(server, tmp_path):
    dest = tmp_path / "sub" / "good.bin"
    assert download(f"{server}/good.bin", dest, sha256=hashlib.sha256(BODY).hexdigest()) == dest
    assert dest.read_bytes() == BODY
    assert os.listdir(dest.parent) == ["good.bin"]  # no temporary file left


def test_a_checksum_mismatch_names_both_sums_and_writes_nothing(server, tmp_path):
    dest = tmp_path / "good.bin"
    wrong = "0" * 64
    with pytest.raises(DataError, match=rf"sha256 mismatch, expected {wrong}, got {hashlib.sha256(BODY).hexdigest()}"):
        download(f"{server}/good.bin", dest, sha256=wrong)
    assert os.listdir(tmp_path) == []


def test_a_gz_url_saved_without_gz_is_unpacked(server, tmp_path):
    packed = gzip.compress(BODY)
    Handler.files["/data.bin.gz"] = packed
    dest = download(f"{server}/data.bin.gz", tmp_path / "data.bin", sha256=hashlib.sha256(packed).hexdigest())
    assert dest.read_bytes() == BODY and os.listdir(tmp_path) == ["data.bin"]
    kept = download(f"{server}/data.bin.gz", tmp_path / "data.bin.gz")
    assert kept.read_bytes() == packed


def test_a_corrupt_gz_is_a_data_error_and_writes_nothing(server, tmp_path):
    with pytest.raises(DataError, match=r"bad\.gz: not a valid gzip file"):
        download(f"{server}/bad.gz", tmp_path / "bad")
    assert os.listdir(tmp_path) == []


def test_a_connection_that_ends_early_names_the_url_and_the_manual_way(server, tmp_path):
    dest = tmp_path / "broken.bin"
    with pytest.raises(OSError, match=rf"download of {server}/broken failed: .*closed after {len(BODY)} of "
                                      rf"{len(BODY) + 5000} bytes.*download .* by hand.*save it as .*broken\.bin"):
        download(f"{server}/broken", dest)
    assert os.listdir(tmp_path) == []


def test_an_http_error_or_refused_connection_is_an_os_error_naming_the_url(server, tmp_path):
    with pytest.raises(OSError, match=rf"download of {server}/missing failed: Not Found"):
        download(f"{server}/missing", tmp_path / "missing")
    with pytest.raises(OSError, match=r"download of http://127\.0\.0\.1:9/x failed"):
        download("http://127.0.0.1:9/x", tmp_path / "x", timeout=5)  # the discard port: nothing listens
    assert os.listdir(tmp_path) == []


def test_load_shd_downloads_a_missing_file_from_the_published_url(server, tmp_path, monkeypatch):
    h5py = pytest.importorskip("h5py")
    source = tmp_path / "source.h5"
    with h5py.File(source, "w") as file:
        times = file.create_dataset("spikes/times", (1,), dtype=h5py.vlen_dtype(np.dtype(np.float32)))
        units = file.create_dataset("spikes/units", (1,), dtype=h5py.vlen_dtype(np.dtype(np.uint16)))
        times[0], units[0] = np.array([0.05, 0.25], np.float32), np.array([10, 20], np.uint16)
        file.create_dataset("labels", data=np.array([4], np.uint8))
    Handler.files["/shd_test.h5.gz"] = gzip.compress(source.read_bytes())
    assert shd.URL == "https://zenkelab.org/datasets/{name}.h5.gz"  # the published address, swapped below
    monkeypatch.setattr(shd, "URL", server + "/{name}.h5.gz")
    root = tmp_path / "data"
    x, y = load_shd(root, "test", dt=0.1, max_time=0.3, download=True, cache=False)
    assert (root / "shd_test.h5").exists()
    assert x.shape == (1, 3, 700) and x[0, 0, 10] == 1 and x[0, 2, 20] == 1 and x.sum() == 2 and y.tolist() == [4]
