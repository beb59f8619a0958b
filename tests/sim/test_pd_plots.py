"""`kvemu sim --plot` on a P/D cluster also draws its TTFT split and pools (sim/pd_plots.py)."""

from __future__ import annotations

from kvemu.cli import main


def test_sim_plot_of_a_pd_run_writes_the_pd_figure(tmp_path):
    path = tmp_path / "run.png"
    rc = main(["sim", "--workload", "chat", "--duration", "60", "--replicas", "0", "--prefill-replicas", "1",
               "--decode-replicas", "1", "--capacity-blocks", "4000", "--reuse", "off", "--quiet", "--jobs", "1",
               "--plot", str(path)])
    assert rc == 0
    assert path.stat().st_size > 0 and (tmp_path / "run-pd.png").stat().st_size > 0


def test_a_colocated_run_draws_no_pd_figure(tmp_path):
    path = tmp_path / "run.png"
    assert main(["sim", "--workload", "chat", "--duration", "60", "--capacity-blocks", "4000", "--reuse", "off",
                 "--quiet", "--jobs", "1", "--plot", str(path)]) == 0
    assert path.exists() and not (tmp_path / "run-pd.png").exists()
