"""`bertdist prepare` on Ray: `options` (what a run is asked to do), `stages` (the three kinds of task:
read, instances, shards) and `driver` (runs the stages, deduplicates, plans groups and shards, writes the
manifest). The rules that turn documents into masked sentence pairs are `bertdist.data.instances`.
"""
