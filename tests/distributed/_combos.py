"""The model/rule pairs the 4-device equivalence runs (read by ``_four_devices.py`` and
``test_data_parallel.py``): every rule on the GRU; each other model under the rules its
data-parallel point needs — ALIF: D-RTRL's two-state traces split over the batch;
dropout: the masks of one key; batch norm: the statistics of the whole batch, through
BPTT's backward pass and a rule's; LSTM: ES-D-RTRL's gates run as one pair in its
step loop (online.shared_groups). The worker joins every hidden group's D-RTRL pairs
into one pass (online.chunk_groups), so the GRU's two weights run it sharded."""

COMBOS = (("gru", "bptt"), ("gru", "d_rtrl"), ("gru", "esd_rtrl"), ("alif", "d_rtrl"), ("dropout", "d_rtrl"),
          ("batchnorm", "bptt"), ("batchnorm", "esd_rtrl"), ("lstm", "esd_rtrl"))
