"""The gate's rules and their noise: the paired rule of an A/B session (paired), the stored-run rule
(regression), their shared words and floor (verdicts), the statistics both use (significance, checked against
scipy.stats in the tests), and where each learns its noise (noise: noise.json's calibration; aa_noise: the
stored A/A runs; stored_noise: the stored runs of the same code)."""
