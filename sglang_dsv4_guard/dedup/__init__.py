"""One report per problem across the processes of one server launch: the launch identity
that proves two processes belong together (:mod:`.identity`) and the marker files they
claim per report fingerprint (:mod:`.markers`)."""
