"""tests/shared_data.py: the shared test data beside the checkout, or an error naming where it was looked for."""

from pathlib import Path

import pytest

from tests import shared_data


def test_the_shared_data_is_beside_the_checkout() -> None:
    found = shared_data.eventnative_data()
    assert found.parent.parent.parent == shared_data.REPOSITORY.parent
    assert (found / "fact_input_with_error_lines_1.0.log").is_file()


def test_a_missing_shared_folder_names_the_expected_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_data, "REPOSITORY", tmp_path / "checkout")
    with pytest.raises(FileNotFoundError) as raised:
        shared_data.shared_dir()
    assert str(tmp_path / "shared" / "testdata") in str(raised.value)
