"""ops/extract/sample_file.py: the image writer's bytes are save_file's, on real files."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import load_file, save_file  # noqa: E402

from ops.extract.sample_file import ALIGN, sample_image, write_image  # noqa: E402


def _tensors(n: int, width: int, dtype) -> dict:
    g = torch.Generator().manual_seed(n)
    return {"input_ids": torch.randint(0, 1000, (n,), generator=g),
            "loss_mask": (torch.rand(n, generator=g) < 0.5).to(torch.uint8),
            "aux_hidden_states": torch.randn(n, 3 * width, generator=g).to(dtype),
            "final_hidden_states": torch.randn(n, width, generator=g).to(dtype)}


@pytest.mark.parametrize("n,width,dtype", [(1, 8, torch.bfloat16), (37, 24, torch.bfloat16),
                                           (513, 64, torch.float16), (100, 16, torch.float32)])
@pytest.mark.parametrize("direct", [False, True])
def test_image_bytes_equal_save_file(tmp_path, n, width, dtype, direct):
    tensors = _tensors(n, width, dtype)
    save_file(tensors, str(tmp_path / "ref.safetensors"))
    image = sample_image(tensors)
    assert image.aligned() and len(image.memory()) % ALIGN == 0
    write_image(tmp_path / "img.safetensors", image, direct=direct)
    assert (tmp_path / "img.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
    back = load_file(str(tmp_path / "img.safetensors"))
    for k, v in tensors.items():
        assert torch.equal(back[k], v)


def test_every_dtype_a_sample_can_hold_sorts_as_safetensors_does(tmp_path):
    tensors = {"a": torch.zeros(3, dtype=torch.int32), "b": torch.ones(2, dtype=torch.float16),
               "c": torch.ones(2, dtype=torch.bfloat16), "d": torch.ones(5, dtype=torch.uint8),
               "e": torch.ones(1, dtype=torch.float32), "f": torch.ones(4, dtype=torch.int64)}
    save_file(tensors, str(tmp_path / "ref"))
    write_image(tmp_path / "img", sample_image(tensors), direct=False)
    assert (tmp_path / "img").read_bytes() == (tmp_path / "ref").read_bytes()


def test_a_failed_write_names_its_file_and_leaves_no_temp_file(tmp_path, monkeypatch):
    """os.write's ENOSPC names no file; the disk-full line (run.py) should."""
    import errno
    import os

    from ops.extract.writer import write_sample

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    target = tmp_path / "rows_0-2000" / "data_0.safetensors"
    with pytest.raises(OSError) as caught:
        write_sample(target, _tensors(8, 8, torch.bfloat16), fsync=True, direct=True)
    assert caught.value.errno == errno.ENOSPC
    assert caught.value.filename == str(target) + ".tmp"
    assert not list(target.parent.iterdir())
