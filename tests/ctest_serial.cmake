# Tests ctest runs alone (read after gtest_discover_tests' list, so the names exist).
#
# CliReproducibility.TheThreadCountDoesNotChangeTheBits: on the 2-core build machine, under
# `ctest -j2` beside the other CLI tests, the MP4 decoded on 3 threads came out different from the
# one decoded on 1 (frame 6 of 22, the soundtrack equal) in about half of the runs. The frames fed
# to the encoder were the same bytes in both runs (hashed before each send): libx264, with its
# default frame threads, encoded identical input differently under CPU contention; with one
# encoder thread it did not. Until media::write_mp4 pins the encoder's threads (a speed cost to
# measure first), the test runs alone, where it checks what it was written for.
set_tests_properties(CliReproducibility.TheThreadCountDoesNotChangeTheBits PROPERTIES RUN_SERIAL TRUE)
