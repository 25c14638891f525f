"""An emulated cluster on one Linux machine, for ``bench/cluster_bench.py`` (issue 5).

N workers, each in its own network namespace, joined by veth pairs to a bridge that lives in
a hub namespace; every link shaped in the kernel (``tbf`` rate limits on both ends of each
veth) and delayed by ``netem`` where the kernel has it, otherwise by a userspace forwarder
between TUN devices. Workers are started through ``utils/launch.sh`` (accelerate or
torchrun), one per namespace, with the rendezvous on rank 0's namespace address; gloo runs
over TCP between the namespaces.

One module, one job:

=============  =============================================================================
``links``      link specs (``1gbit/1ms``), named presets, tc arguments (stdlib only)
``netns``      build and remove the namespaces, bridge, veths, addresses; leftovers cleanup
``delay``      the userspace delay forwarder on a TUN device (``python -m bench.cluster.delay``)
``shaping``    apply a link spec to a cluster: tbf rates, netem or the forwarder for delay
``probe``      measure what the emulated links give: TCP round-trip time and bulk throughput
``launch``     start one launcher per namespace (utils/launch.sh), stream rank 0, collect
``workloads``  the mini LM of the LM recipe and a synthetic model of a given parameter count
``runs``       one training set-up per setting: no-comm, ddp, the synchronizer's settings
``timing``     timed training with agreed stops, ending on a whole sync cycle
``overhead``   the synchronizer's cost against a raw torch.distributed replay of its calls
``worker``     what runs in each namespace: every setting timed, traffic, overhead, quality
``report``     the table, the JSON and the plots
=============  =============================================================================

The harness side (``links``, ``netns``, ``delay``, ``shaping``, ``probe``, ``launch``, ``report``)
imports no torch; ``bench/README.md`` says what the numbers mean and how to run the same
workloads on a real cluster.
"""
