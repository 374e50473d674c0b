"""SPD: an N x K item-position matrix from one prefill, trained through log-Sinkhorn and decoded
by assignment (:mod:`.method`, with its heads in :mod:`.heads` and :mod:`.history`, its loss in
:mod:`.loss` and its decoders in :mod:`.decode`).
"""

#: How the loss weighs a target's positions (:func:`.loss.permutation_cross_entropy`); named
#: here, free of torch, for the command line.
POSITION_WEIGHTS = ("uniform", "dcg")
