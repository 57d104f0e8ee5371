"""The driver's console (hora.runners.driver.progress): bars on a terminal, one line per epoch elsewhere."""

import io

from hora.runners.driver.progress import Progress


def _epoch_reports(progress, epoch, epochs=3, total=4, final_loss=0.25):
    for step in (1, 3):
        progress.update(0, {"epoch": epoch, "epochs": epochs, "step": step, "total": total, "loss": 9.0,
                            "elapsed_s": 0.5 * step, "rows": 10 * step})
    progress.update(0, {"epoch": epoch, "epochs": epochs, "step": total, "total": total, "loss": final_loss,
                        "val_loss": 0.5, "elapsed_s": 2.0, "rows": 40, "final": True})


def test_off_a_terminal_one_line_per_epoch_with_final_metrics_and_rank_rate():
    out = io.StringIO()
    progress = Progress("run-x", stream=out, interactive=False)
    for epoch in (1, 2, 3):
        _epoch_reports(progress, epoch, final_loss=0.25 * epoch)
    progress.update(1, {"epoch": 3, "epochs": 3, "step": 4, "total": 4, "loss": 7.0, "final": True})  # not followed
    progress.close()
    lines = out.getvalue().splitlines()
    assert lines == [f"epoch {e}/3: loss={0.25 * e:.4g} val_loss=0.5 | 2.0 s, 20 rows/s" for e in (1, 2, 3)]
    assert progress.shown[2] == {"loss": "0.5", "val_loss": "0.5"}


def test_an_overtaken_final_report_ends_the_epoch_with_last_epoch_metrics():
    out = io.StringIO()
    progress = Progress("run-x", stream=out, interactive=False)
    progress.update(0, {"epoch": 1, "epochs": 2, "step": 2, "total": 4, "loss": 9.0})
    progress.update(0, {"epoch": 2, "epochs": 2, "step": 1, "total": 4, "loss": 8.0,
                        "last_epoch": {"loss": 30.01, "elapsed_s": 4.0, "rows": 80}})
    # the late final report of epoch 1 must not print it a second time
    progress.update(0, {"epoch": 1, "epochs": 2, "step": 4, "total": 4, "loss": 30.01, "final": True})
    progress.close()
    assert out.getvalue().splitlines() == ["epoch 1/2: loss=30.01 | 4.0 s, 20 rows/s"]


def test_on_a_terminal_the_bar_ends_with_the_logged_value_and_the_rank_rate():
    out = io.StringIO()
    progress = Progress("run-x", stream=out, interactive=True)
    progress.update(0, {"epoch": 1, "epochs": 1, "step": 3, "total": 4, "loss": 9.0, "elapsed_s": 1.5, "rows": 30})
    bar = progress._bar
    assert "2 steps/s" in str(bar) and "20 rows/s" in str(bar)  # 3 steps in 1.5 s on the rank
    progress.update(0, {"epoch": 1, "epochs": 1, "step": 4, "total": 4, "loss": 0.125, "elapsed_s": 2.0,
                        "rows": 40, "final": True})
    assert progress._bar is None and bar.n == 4 and "loss=0.125" in str(bar)
    text = out.getvalue()
    assert "epoch 1/1: 100%" in text and "run-x" not in text


def test_a_user_report_without_epochs_ends_with_one_line_off_a_terminal():
    out = io.StringIO()
    progress = Progress("run-x", stream=out, interactive=False)
    progress.update(0, {"step": 3, "total": 4, "loss": 0.125})
    progress.close()
    progress.close()
    assert out.getvalue() == "step 3/4: loss=0.125\n"


def test_epochs_whose_reports_were_all_overtaken_come_from_epochs_done():
    out = io.StringIO()
    progress = Progress("run-x", stream=out, interactive=False)
    done = [{"epoch": e, "loss": 1.0 / e, "elapsed_s": 1.0, "rows": 10} for e in (1, 2, 3)]
    progress.update(0, {"epoch": 3, "epochs": 3, "step": 4, "total": 4, "loss": 1.0 / 3, "elapsed_s": 1.0,
                        "rows": 10, "final": True, "epochs_done": done})
    progress.close()
    assert out.getvalue().splitlines() == [f"epoch {e}/3: loss={1.0 / e:.4g} | 1.0 s, 10 rows/s" for e in (1, 2, 3)]


def test_an_unfinished_epoch_ends_with_one_line_of_its_latest_metrics_off_a_terminal():
    out = io.StringIO()
    progress = Progress("run-x", stream=out, interactive=False)
    for step in (1, 2, 3):
        progress.update(0, {"epoch": 0, "step": step, "total": 3, "loss": 1.0 / step})
    progress.close()
    assert out.getvalue() == "epoch 0 step 3/3: loss=0.3333\n"
