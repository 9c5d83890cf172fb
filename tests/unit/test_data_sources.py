"""fedrun.data.sources: real datasets from the shared folder, search order, errors, file layouts."""

from __future__ import annotations

import csv
import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision import datasets as tvd

from fedrun.data import dataset as dataset_mod
from fedrun.data import lending_club
from fedrun.data.sources import (
    DATASETS,
    DataIntegrityError,
    DataNotFoundError,
    cache_dir,
    load_dataset,
    search_roots,
)
from tolerance import assert_f32_close, f32_tol

IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    """No ambient FEDRUN_DATA / cache / Debian folder leaks into a test; the cache is a tmp folder."""
    monkeypatch.delenv("FEDRUN_DATA", raising=False)
    monkeypatch.setenv("FEDRUN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(dataset_mod, "DEBIAN_FASHION_MNIST_DIR", tmp_path / "no-debian")
    import fedrun.data.mnist as mnist_mod

    monkeypatch.setattr(mnist_mod, "DEBIAN_FASHION_MNIST_DIR", tmp_path / "no-debian")


def _load_real(name: str, root: Path, cache: Path):
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("FEDRUN_DATA", raising=False)
        mp.setenv("FEDRUN_CACHE", str(cache))
        return load_dataset(name, data_root=root, download=False)


@pytest.fixture(scope="module")
def real_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fedrun-cache")


@pytest.fixture(scope="module")
def mnist(shared_data, real_cache):
    return _load_real("mnist", shared_data, real_cache)


@pytest.fixture(scope="module")
def fashion(shared_data, real_cache):
    return _load_real("fashion_mnist", shared_data, real_cache)


@pytest.fixture(scope="module")
def femnist(shared_data, real_cache):
    return _load_real("femnist", shared_data, real_cache)


@pytest.fixture(scope="module")
def lc(shared_data, real_cache):
    return _load_real("lending_club", shared_data, real_cache)


# ---------------------------------------------------------------- real data (shared folder)


def test_mnist_real(mnist, shared_data, real_cache):
    d = mnist
    assert (d.num_train, d.num_test) == (60000, 10000)
    assert d.x_train.shape == (60000, 1, 28, 28) and d.x_train.dtype == torch.float32
    assert d.y_train.dtype == torch.int64 and d.input_shape == (1, 28, 28)
    assert d.task == "classification" and d.num_classes == 10 and d.groups_train is None
    assert torch.bincount(d.y_train).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert torch.bincount(d.y_test).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert d.y_train[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert d.y_test[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    assert abs(d.x_train.mean().item()) < 0.01 and abs(d.x_train.std().item() - 1) < 0.01
    # background = 0 → (0 − mean)/std in float32: the constants' roundings, the subtraction, the division
    assert d.x_train.min().item() == pytest.approx(-0.1307 / 0.3081, abs=f32_tol(0.1307 / 0.3081, terms=4))
    assert d.source == str(shared_data / "MNIST" / "raw")
    # unpacked once into the (tmp) cache in torchvision's layout; nothing written beside the source
    assert sorted(p.name for p in (real_cache / "MNIST" / "raw").iterdir() if not p.name.startswith(".")) == sorted(
        IDX_FILES
    )


def test_fashion_mnist_real(fashion):
    d = fashion
    assert (d.num_train, d.num_test) == (60000, 10000)
    assert torch.bincount(d.y_train).tolist() == [6000] * 10
    assert torch.bincount(d.y_test).tolist() == [1000] * 10
    assert d.y_train[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]
    assert abs(d.x_train.mean().item()) < 0.01 and abs(d.x_train.std().item() - 1) < 0.01
    assert d.info["normalization"] == {"mean": 0.2860, "std": 0.3530}


def test_cache_reused_on_second_load(mnist, shared_data, real_cache):
    raw = real_cache / "MNIST" / "raw"
    before = {p.name: p.stat().st_mtime_ns for p in raw.iterdir()}
    again = _load_real("mnist", shared_data, real_cache)
    assert {p.name: p.stat().st_mtime_ns for p in raw.iterdir()} == before
    assert torch.equal(again.y_train, mnist.y_train)


def test_femnist_real(femnist):
    d = femnist
    assert (d.num_train, d.num_test) == (29224, 3358)
    assert d.x_train.shape == (29224, 1, 28, 28) and d.num_classes == 62
    assert len(d.group_names) == 212 and len(np.unique(d.groups_train)) == 212
    assert set(np.unique(d.groups_test)) <= set(np.unique(d.groups_train))
    assert d.group_names == sorted(d.group_names) and d.group_names[0] == "f0424_27"
    counts = np.bincount(d.groups_train)
    assert (counts.min(), np.median(counts), counts.max()) == (2, 150, 320)
    assert int(d.y_train.min()) == 0 and int(d.y_train.max()) == 61
    assert torch.bincount(d.y_train, minlength=62)[:10].sum().item() == 20580  # digits
    # MNIST-like polarity: background is the smallest (most common) value, ink is bright
    x = d.x_train[:200].flatten()
    mode = x.mode().values.item()
    # background: (0 − mean)/std computed in float64, cast to float32 (one rounding)
    assert mode == x.min().item() and mode == pytest.approx(-0.0387 / 0.1648, abs=f32_tol(0.0387 / 0.1648, terms=1))
    assert abs(d.x_train.mean().item()) < 0.01


def test_lending_club_real(lc, shared_data):
    d = lc
    assert (d.num_train, d.num_test) == (7886, 1971) and d.num_train + d.num_test == 9857
    assert d.task == "regression" and d.num_classes is None
    assert d.x_train.shape == (7886, 10) and d.input_shape == (10,) and d.x_train.dtype == torch.float32
    assert d.y_train.dtype == torch.float32 and d.y_train.ndim == 1
    assert d.feature_names == list(lending_club.FEATURES) and len(d.feature_names) == 10
    assert not {"sub_grade", "grade", "Class", "int_rate"} & set(d.feature_names)
    assert len(d.group_names) == 50 and len(np.unique(np.concatenate([d.groups_train, d.groups_test]))) == 50
    y_all = torch.cat([d.y_train, d.y_test]).double()
    assert y_all.mean().item() == pytest.approx(12.5265, abs=5e-5)  # percent, unstandardised (to the 4th decimal)
    # the CSV's two-decimal rates, cast to float32 (one rounding)
    assert y_all.min().item() == pytest.approx(5.32, abs=f32_tol(5.32)) and \
        y_all.max().item() == pytest.approx(28.99, abs=f32_tol(28.99))


def test_lending_club_standardised_with_train_stats_only(lc, shared_data):
    rows = list(csv.DictReader(open(shared_data / "lending-club" / "lending_club.csv")))
    raw = np.array([[float(r["revol_util"]), float(r["funded_amnt"])] for r in rows])
    states = np.array([r["addr_state"] for r in rows])
    tr, te = lending_club.split_indices(len(rows))
    j = [lc.feature_names.index("revol_util"), lc.feature_names.index("funded_amnt")]
    mean, std = np.array(lc.info["feature_mean"])[j], np.array(lc.info["feature_std"])[j]
    np.testing.assert_allclose(mean, raw[tr].mean(0), rtol=1e-12)
    np.testing.assert_allclose(std, raw[tr].std(0), rtol=1e-12)
    assert not np.allclose(mean, raw.mean(0), rtol=1e-6)  # not the full-data statistics
    # standardised in float64, then cast to float32: each value rounded once (relative eps32/2), so the mean
    # moves by at most that of mean|z| and the std by that of rms(z) = 1
    z_train = lc.x_train[:, j].double()
    assert_f32_close(z_train.mean(0), np.zeros(2), z_train.abs().mean(0), terms=1)
    assert_f32_close(z_train.std(0, unbiased=False), np.ones(2), np.ones(2), terms=2)
    z_test = (raw[te] - mean) / std
    assert_f32_close(lc.x_test[:, j], z_test, z_test, terms=1)
    assert [lc.group_names[g] for g in lc.groups_test[:20]] == states[te][:20].tolist()
    rates = np.array([float(rows[i]["int_rate"]) for i in te[:5]])
    assert_f32_close(lc.y_test[:5], rates, rates, terms=1)  # cast to float32


def test_lending_club_split_is_fixed_and_disjoint():
    tr, te = lending_club.split_indices(9857)
    tr2, _ = lending_club.split_indices(9857)
    assert np.array_equal(tr, tr2) and len(tr) == 7886 and len(te) == 1971
    assert np.array_equal(np.sort(np.concatenate([tr, te])), np.arange(9857))


# ---------------------------------------------------------------- search order and not-found errors


def test_search_roots_order_and_cache_dir(monkeypatch, tmp_path):
    for d in ("arg", "env"):
        (tmp_path / d).mkdir()
    monkeypatch.setenv("FEDRUN_DATA", str(tmp_path / "env"))
    monkeypatch.setenv("FEDRUN_CACHE", str(tmp_path / "cache"))
    assert search_roots(tmp_path / "arg") == [tmp_path / "arg", tmp_path / "env", tmp_path / "cache"]
    assert search_roots(tmp_path / "env") == [tmp_path / "env", tmp_path / "cache"]
    monkeypatch.delenv("FEDRUN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "fedrun"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "fedrun"


@pytest.mark.parametrize("where", ["data_root", "FEDRUN_DATA"])
def test_a_named_folder_that_does_not_exist_is_an_error(where, monkeypatch, tmp_path):
    """A folder the user named must exist: a typo never falls through to the copy in the cache."""
    monkeypatch.setenv("FEDRUN_CACHE", str(tmp_path / "cache"))
    (tmp_path / "file").write_text("")
    for bad, what in ((tmp_path / "nowhere", "does not exist"), (tmp_path / "file", "is not a folder")):
        if where == "FEDRUN_DATA":
            monkeypatch.setenv("FEDRUN_DATA", str(bad))
            call = lambda: search_roots(None)  # noqa: E731
        else:
            monkeypatch.delenv("FEDRUN_DATA", raising=False)
            call = lambda: search_roots(bad)  # noqa: E731
        with pytest.raises(DataNotFoundError) as e:
            call()
        assert str(e.value) == (f"{where}={bad}: the data folder {what}; give an existing folder (or unset it "
                                f"to use the cache {tmp_path / 'cache'})")


def test_unknown_dataset_names_allowed():
    with pytest.raises(ValueError, match="cifar10.*fashion_mnist, mnist, femnist, lending_club"):
        load_dataset("cifar10")
    with pytest.raises(ValueError, match="download='yes'"):
        load_dataset("mnist", download="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", DATASETS)
def test_not_found_lists_every_searched_place(name, monkeypatch, tmp_path):
    for d in ("arg", "env"):
        (tmp_path / d).mkdir()
    monkeypatch.setenv("FEDRUN_DATA", str(tmp_path / "env"))
    with pytest.raises(DataNotFoundError) as e:
        load_dataset(name, data_root=tmp_path / "arg", download=False)
    msg = str(e.value)
    assert isinstance(e.value, FileNotFoundError)
    for place in ("arg", "env", "cache"):
        assert str(tmp_path / place) in msg
    assert "FEDRUN_DATA" in msg and "data_root" in msg
    if name == "fashion_mnist":
        assert str(tmp_path / "no-debian") in msg and "apt-get install dataset-fashion-mnist" in msg
    if name in ("mnist", "fashion_mnist"):
        assert "download" in msg


# ---------------------------------------------------------------- IDX layouts, checks, download (tiny fakes)


def _write_idx_set(folder: Path, gz: bool | dict[str, bool], n_train: int = 5, n_test: int = 3) -> None:
    """Four tiny but valid IDX files (labels i % 10, image i filled with value i)."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in IDX_FILES:
        n = n_train if f.startswith("train") else n_test
        if "images" in f:
            body = b"".join(bytes([i]) * 784 for i in range(n))
            data = (2051).to_bytes(4, "big") + n.to_bytes(4, "big") + (28).to_bytes(4, "big") * 2 + body
        else:
            data = (2049).to_bytes(4, "big") + n.to_bytes(4, "big") + bytes(i % 10 for i in range(n))
        zipped = gz if isinstance(gz, bool) else gz[f]
        if zipped:
            (folder / f"{f}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / f).write_bytes(data)


def _fake_ok(d, n_train: int = 5, n_test: int = 3) -> None:
    assert (d.num_train, d.num_test) == (n_train, n_test)
    assert d.y_train.tolist() == [i % 10 for i in range(n_train)]
    assert d.x_train.shape == (n_train, 1, 28, 28)


def test_debian_flat_folder(monkeypatch, tmp_path):
    import fedrun.data.mnist as mnist_mod

    deb = tmp_path / "debian" / "fashion-mnist"
    _write_idx_set(deb, gz=True)
    monkeypatch.setattr(mnist_mod, "DEBIAN_FASHION_MNIST_DIR", deb)
    d = load_dataset("fashion_mnist", download=False, verify=False)
    _fake_ok(d)
    assert d.source == str(deb)
    assert (tmp_path / "cache" / "FashionMNIST" / "raw" / "train-images-idx3-ubyte").is_file()
    again = load_dataset("fashion_mnist", download=False, verify=False)  # now read from the cache in place
    assert again.source == str(deb) and again.info["torchvision_root"] == str(tmp_path / "cache")


def test_plain_files_in_torchvision_layout_used_in_place(tmp_path):
    _write_idx_set(tmp_path / "root" / "MNIST" / "raw", gz=False)
    d = load_dataset("mnist", data_root=tmp_path / "root", download=False, verify=False)
    _fake_ok(d)
    assert d.source == str(tmp_path / "root" / "MNIST" / "raw")
    assert not (tmp_path / "cache").exists()  # nothing unpacked


def test_idx_files_read_as_torchvision_reads_them(fashion):
    """fedrun reads the IDX files itself (torchvision's import costs a second); same tensors as torchvision's."""
    root = fashion.info["torchvision_root"]
    for train, x, y in ((True, fashion.x_train, fashion.y_train), (False, fashion.x_test, fashion.y_test)):
        tv = tvd.FashionMNIST(root, train=train)
        assert torch.equal(x, tv.data.to(torch.float32).div_(255.0).sub_(0.2860).div_(0.3530).unsqueeze(1))
        assert torch.equal(y, tv.targets) and y.dtype == torch.int64


@pytest.mark.parametrize("damage", ["header", "short"])
def test_malformed_idx_file_unchecked_is_reported_with_file_name(damage, tmp_path):
    raw = tmp_path / "root" / "MNIST" / "raw"
    _write_idx_set(raw, gz=False)
    bad = raw / "t10k-images-idx3-ubyte"
    bad.write_bytes(bytes(4) + bad.read_bytes()[4:] if damage == "header" else bad.read_bytes()[:-1])
    with pytest.raises(DataIntegrityError, match=r"t10k-images-idx3-ubyte: not an IDX file"):
        load_dataset("mnist", data_root=tmp_path / "root", download=False, verify=False)


@pytest.mark.parametrize("layout", ["MNIST", "MNIST/raw-mixed"])
def test_gz_and_mixed_layouts_are_unpacked(layout, tmp_path):
    folder = tmp_path / "root" / "MNIST" / ("raw" if layout.endswith("mixed") else "")
    gz = {f: (i % 2 == 0) for i, f in enumerate(IDX_FILES)} if layout.endswith("mixed") else True
    _write_idx_set(folder, gz=gz, n_train=12)
    d = load_dataset("mnist", data_root=tmp_path / "root", download=False, verify=False)
    _fake_ok(d, n_train=12)
    assert (tmp_path / "cache" / "MNIST" / "raw" / ".fedrun-source.json").is_file()


def test_wrong_size_is_reported_with_file_name(tmp_path):
    _write_idx_set(tmp_path / "root" / "MNIST" / "raw", gz=True)
    with pytest.raises(DataIntegrityError, match=r"train-images-idx3-ubyte\.gz: truncated: 3936 bytes.*47040016"):
        load_dataset("mnist", data_root=tmp_path / "root", download=False)


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_gz_is_reported_with_file_name(damage, tmp_path):
    raw = tmp_path / "root" / "MNIST" / "raw"
    _write_idx_set(raw, gz=True)
    bad = raw / "train-labels-idx1-ubyte.gz"
    bad.write_bytes(bad.read_bytes()[:-12] if damage == "truncate" else b"not a gzip file at all")
    with pytest.raises(DataIntegrityError, match=r"train-labels-idx1-ubyte\.gz: cannot read/decompress.*corrupt"):
        load_dataset("mnist", data_root=tmp_path / "root", download=False, verify=False)


def test_checksum_mismatch_is_reported_with_file_name(tmp_path):
    raw = tmp_path / "root" / "FashionMNIST" / "raw"
    _write_idx_set(raw, gz=False)
    (raw / "train-images-idx3-ubyte").write_bytes(bytes(47040016))  # right size, wrong content
    with pytest.raises(DataIntegrityError, match=r"train-images-idx3-ubyte: checksum mismatch.*f4a8712d"):
        load_dataset("fashion_mnist", data_root=tmp_path / "root", download=False)


def test_offline_download_failure_is_caught(monkeypatch, tmp_path):
    def offline(self):
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz: no network (test)")

    monkeypatch.setattr(tvd.MNIST, "download", offline)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataNotFoundError, match=r"(?s)Download: RuntimeError: Error downloading"):
        load_dataset("mnist", data_root=tmp_path / "empty", download=None)
    # download=True also replaces a corrupt local copy by a download (which fails here → not found)
    _write_idx_set(tmp_path / "root" / "MNIST" / "raw", gz=True)
    with pytest.raises(DataNotFoundError, match="no network"):
        load_dataset("mnist", data_root=tmp_path / "root", download=True)


def test_download_lands_in_cache(monkeypatch, tmp_path):
    def fake_download(self):
        _write_idx_set(Path(self.raw_folder), gz=False)

    monkeypatch.setattr(tvd.MNIST, "download", fake_download)
    (tmp_path / "empty").mkdir()
    d = load_dataset("fashion_mnist", data_root=tmp_path / "empty", verify=False)
    _fake_ok(d)
    assert d.source == str(tmp_path / "cache" / "FashionMNIST" / "raw")


# ---------------------------------------------------------------- FEMNIST: LEAF JSON and npz errors


def _leaf_user(rng: np.random.Generator, n: int) -> dict:
    x = rng.integers(0, 256, size=(n, 784)) / 255.0
    return {"x": x.tolist(), "y": rng.integers(0, 62, size=n).tolist()}


def _write_leaf(base: Path) -> dict[str, dict[str, dict]]:
    """train: 2 shards (users b,a | c), test: 1 shard (a,b,c)."""
    rng = np.random.default_rng(0)
    layout = {
        "train/all_data_0_niid_05_keep_0_train_9.json": {"f002_1": 4, "f001_7": 3},
        "train/all_data_1_niid_05_keep_0_train_9.json": {"f003_2": 5},
        "test/all_data_0_niid_05_keep_0_test_9.json": {"f001_7": 1, "f002_1": 2, "f003_2": 1},
    }
    out: dict[str, dict[str, dict]] = {}
    for rel, users in layout.items():
        data = {u: _leaf_user(rng, n) for u, n in users.items()}
        doc = {"users": list(users), "num_samples": list(users.values()), "user_data": data}
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text(json.dumps(doc))
        out[rel] = data
    return out


def test_femnist_leaf_json(tmp_path):
    written = _write_leaf(tmp_path / "leaf")
    d = load_dataset("femnist", femnist_leaf_dir=tmp_path / "leaf")
    assert (d.num_train, d.num_test) == (12, 4) and d.x_train.shape == (12, 1, 28, 28)
    assert d.group_names == ["f001_7", "f002_1", "f003_2"]
    assert [d.group_names[g] for g in d.groups_train] == ["f002_1"] * 4 + ["f001_7"] * 3 + ["f003_2"] * 5
    first = written["train/all_data_0_niid_05_keep_0_train_9.json"]["f002_1"]
    assert d.y_train[:4].tolist() == first["y"]
    expected = ((1.0 - np.array(first["x"][0])) - 0.0387) / 0.1648  # flipped to ink-bright, standardised
    # float32 round-off of 1 − x, − mean, / std and the cast, at the scale of their terms
    assert_f32_close(d.x_train[0].flatten(), expected, (1.0 + np.abs(first["x"][0]) + 0.0387) / 0.1648, terms=4)
    assert d.info["format"] == "leaf-json"


def test_femnist_leaf_found_under_data_root_and_leaf_layout(tmp_path):
    _write_leaf(tmp_path / "root" / "FEMNIST" / "leaf")
    assert load_dataset("femnist", data_root=tmp_path / "root").num_train == 12
    _write_leaf(tmp_path / "leafrepo" / "data" / "femnist" / "data")  # LEAF checkout: pass data/femnist
    assert load_dataset("femnist", femnist_leaf_dir=tmp_path / "leafrepo" / "data" / "femnist").num_test == 4


def test_femnist_leaf_bad_files(tmp_path):
    _write_leaf(tmp_path / "leaf")
    bad = tmp_path / "leaf" / "train" / "all_data_1_niid_05_keep_0_train_9.json"
    bad.write_text('{"users": ["u"], "num_samples": [1], "user_data": {"u": {"x": [[0.5, 0.5]], "y": [1]}}}')
    with pytest.raises(DataIntegrityError, match=r"all_data_1.*user 'u'.*784"):
        load_dataset("femnist", femnist_leaf_dir=tmp_path / "leaf")
    bad.write_text("{not json")
    with pytest.raises(DataIntegrityError, match=r"all_data_1_niid_05_keep_0_train_9\.json: not a LEAF JSON"):
        load_dataset("femnist", femnist_leaf_dir=tmp_path / "leaf")


def test_femnist_npz_missing_or_corrupt(shared_data, tmp_path):
    folder = tmp_path / "root" / "FEMNIST"
    folder.mkdir(parents=True)
    shutil.copy(shared_data / "FEMNIST" / "test.npz", folder / "test.npz")
    with pytest.raises(DataNotFoundError, match=r"train\.npz is missing"):
        load_dataset("femnist", data_root=tmp_path / "root")
    (folder / "train.npz").write_bytes((shared_data / "FEMNIST" / "train.npz").read_bytes()[:100000])
    with pytest.raises(DataIntegrityError, match=r"train\.npz: cannot read"):
        load_dataset("femnist", data_root=tmp_path / "root")


# ---------------------------------------------------------------- Lending Club: other CSV shapes


def test_lending_club_full_export_format(tmp_path):
    cols = ["id", "funded_amnt", "term", "int_rate", "grade", "sub_grade", "addr_state", "verification_status",
            "annual_inc", "inq_last_6mths", "revol_util", "open_il_12m", "all_util", "inq_last_12m", "num_il_tl"]
    rows = [
        ["1", "10000", " 36 months", " 13.56%", "C", "C1", "CA", "Not Verified", "55000", "1", "45.2%", "0", "60", "2", "3"],
        ["2", "20000", " 60 months", " 18.06%", "D", "D2", "NY", "Source Verified", "90000", "0", "70%", "2", "75", "1", "5"],
        ["3", "5000", " 36 months", " 7.07%", "A", "A2", "CA", "Verified", "120000", "0", "10.5%", "1", "", "0", "2"],
        ["4", "8000", " 36 months", " 9.93%", "B", "B2", "TX", "Verified", "40000", "2", "33%", "1", "50", "3", "4"],
        ["5", "12000", " 60 months", " 11.5%", "B", "B4", "NY", "Not Verified", "0", "1", "80%", "0", "90", "1", "1"],
    ]
    path = tmp_path / "LoanStats_2016Q1.csv"
    with open(path, "w", newline="") as fh:
        fh.write("Notes offered by Prospectus (https://www.lendingclub.com/info/prospectus.action)\n")
        w = csv.writer(fh)
        w.writerow(cols)
        w.writerows(rows)
        fh.write("\nTotal amount funded in policy code 1: 45000\n")
    d = load_dataset("lending_club", lending_club_csv=path)
    assert d.info["dropped_rows"] == 3  # missing all_util, blank line, footer
    assert d.num_train + d.num_test == 4 and d.group_names == ["CA", "NY", "TX"]
    raw = lending_club.read_csv(path)
    x, y = raw[0], raw[1]
    assert y.tolist() == [13.56, 18.06, 9.93, 11.5]
    names = list(lending_club.FEATURES)
    assert x[:, names.index("term_60")].tolist() == [0, 1, 0, 1]
    assert x[:, names.index("verified")].tolist() == [0, 1, 1, 0]
    assert x[:, names.index("revol_util")].tolist() == [45.2, 70, 33, 80]
    assert x[:, names.index("log1p_annual_inc")][-1] == 0.0


def test_lending_club_missing_column_named(shared_data, tmp_path):
    src = shared_data / "lending-club" / "lending_club.csv"
    lines = src.read_text().splitlines()[:50]
    header = lines[0].split(",")
    k = header.index("all_util")
    cut = [",".join(c for i, c in enumerate(line.split(",")) if i != k) for line in lines]
    (tmp_path / "lending-club").mkdir()
    (tmp_path / "lending-club" / "lending_club.csv").write_text("\n".join(cut) + "\n")
    with pytest.raises(DataIntegrityError, match=r"missing column\(s\) \['all_util'\]"):
        load_dataset("lending_club", data_root=tmp_path)
