"""Where a file goes after cutoff 2: the partner destination over SFTP, its evidence, and the verdicts drawn from it."""
