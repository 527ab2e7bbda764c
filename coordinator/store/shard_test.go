package store

import (
	"context"
	"fmt"
	"testing"

	"github.com/coordd/coordd/internal/redistest"
)

// TestShardTagsClusterSlots: shard channel i hashes to a slot in
// [1024i, 1024i+1024), as shardTags claims, by Redis's own reckoning.
func TestShardTagsClusterSlots(t *testing.T) {
	rdb := redistest.StartCluster(t, 1).Client(t)
	for i, ch := range shardChannelNames("coordd:") {
		slot, err := rdb.ClusterKeySlot(context.Background(), ch).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %s: %v", ch, err)
		}
		if got := int(slot / 1024); got != i {
			t.Errorf("%s: slot %d is in range %d; want %d", ch, slot, got, i)
		}
	}
}

// TestShardOfSpreads: ids spread evenly enough over the shards, and one
// shard takes them all.
func TestShardOfSpreads(t *testing.T) {
	const n, ids = shardChannels, 16000
	var count [n]int
	for i := range ids {
		count[shardOf(fmt.Sprintf("fake https://example.org/docs/%d", i), n)]++
	}
	for s, c := range count {
		if c < ids/n/2 || c > ids/n*2 {
			t.Errorf("shard %d got %d of %d ids; want about %d", s, c, ids, ids/n)
		}
	}
	if got := shardOf("anything", 1); got != 0 {
		t.Errorf("shardOf(_, 1) = %d; want 0", got)
	}
}
