"""e-prop's evidence-accumulation task with its published preset (Bellec et al. 2020).

40 input channels in 4 groups (left cues, right cues, recall, noise); 50 ms of noise,
7 cues of 100 ms with 50 ms pauses (each trial favours a side; a cue goes to the other
side with probability 0.3), a 1000 ms delay, a 150 ms recall cue: T = 2250 steps at
dt = 1 ms. The network is e-prop's LSNN: 100 recurrent neurons without self-connections,
50 LIF and 50 ALIF (tau_m = 20 ms, tau_a = 2000 ms, beta = 1.7 (1 - rho)/(1 - alpha)
~ 0.017, threshold 0.6, refractory 5 ms), a leaky readout whose cross-entropy is read
during the recall cue, the rate regularised to 10 Hz (NeuronRateRegularizer), batch 64,
Adam 5e-3. Published: < 7 % error after about 200-500 iterations. Each run gets a
folder in --logdir (TensorBoard, log.csv, best.ckpt).

    python examples/evidence_accumulation.py [--algo hybrid] [--epochs 8] [--seed 0]
"""

from __future__ import annotations

from etrace_fit import tasks


def main(argv: list[str] | None = None) -> dict:
    return tasks.script("eprop-evidence", __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
