"""MAP-Elites on an 8-joint planar arm: the straightest arm for every place it can reach.

    python examples/mapelites_arm.py [--devices 2]

A 32 x 32 grid over the end effector's (x, y), 128 candidates per generation by
isoline variation, the archive sharded across the devices by cell. Writes the run
folder runs/examples/mapelites-arm (with archive.npz and archive.png, the heat map of
the elites) and figures/mapelites_arm.png (the batches' fitness).
"""

from evorl_pop.run import script

args = script.start(__doc__, generations=100)

from evorl_pop.algorithms.mapelites import MapElitesConfig  # noqa: E402

config = MapElitesConfig(task="qd/arm", num_dims=8, population_size=128, cells_per_dim=32)
results = script.train(args, {"mapelites-arm": config}, "mapelites_arm.png",
                       "MAP-Elites, 8-joint arm, 128 candidates per generation",
                       chunk=25, checkpoint_every=0)  # fmt: skip
result = results["mapelites-arm"]
history = result.history
print(
    f"coverage {history['coverage'][-1]:.1%} of {32 * 32} cells, QD-score "
    f"{history['qd_score'][-1]:.4g}, best fitness {history['archive_fitness_max'][-1]:.3g}; "
    f"the archive: {result.run_dir / 'archive.png'}"
)
