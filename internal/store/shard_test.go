package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/coordd/coordd/internal/testing/redistest"
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

// TestShardedPubSubOnCluster: on a Redis Cluster, every instance's hub
// subscribes to each shard channel on the node that owns its slot, and
// an event of any id, whichever shard it falls in, reaches the other
// instances' waiters of that id, SPUBLISHed to its shard channel after
// the script: a follower woken by a done event finds the lock released
// and the document in L2, and nothing is PUBLISHed (broadcast to every
// node).
func TestShardedPubSubOnCluster(t *testing.T) {
	rc := redistest.StartCluster(t, 3)
	a, _ := startStore(t, rc.Client(t))
	b, _ := startStore(t, rc.Client(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if got := a.Mode(); got != "cluster" {
		t.Fatalf("Mode() = %q; want cluster", got)
	}
	if len(a.shards) != shardChannels {
		t.Fatalf("%d shard channels; want %d", len(a.shards), shardChannels)
	}
	for _, ch := range a.shards {
		subs, err := rc.MasterOf(t, ch).Client(t).PubSubShardNumSub(ctx, ch).Result()
		if err != nil || subs[ch] != 2 {
			t.Fatalf("PUBSUB SHARDNUMSUB %s on its owner = %v, %v; want both hubs", ch, subs, err)
		}
	}
	// A plain subscriber on every master: a script's PUBLISH reaches the
	// one on its own node first.
	plain := make([]*redis.PubSub, rc.Len())
	for i := range plain {
		plain[i] = rc.Node(i).Client(t).Subscribe(ctx, a.channel())
		defer plain[i].Close()
		if _, err := plain[i].Receive(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// One id in each shard.
	ids := make([]string, shardChannels)
	for i, n := 0, 0; n < shardChannels; i++ {
		id := fmt.Sprintf("https://example.org/sharded/%d", i)
		if s := shardOf(id, shardChannels); ids[s] == "" {
			ids[s] = id
			n++
		}
	}
	for shard, id := range ids {
		w := a.Register(id)
		l, _, err := b.TryLock(ctx, id, time.Minute)
		if err != nil || l == nil {
			t.Fatalf("TryLock(%s) = %v, %v", id, l, err)
		}
		_, enc := doc(id, "body")
		if landed, err := b.Land(l, id, "", enc, time.Hour, true); err != nil || !landed {
			t.Fatalf("Land(%s) = %v, %v", id, landed, err)
		}
		ev := nextOf(t, w, EventDone)
		if h, err := a.HolderOf(ctx, id); err != nil || h.Token != "" {
			t.Fatalf("shard %d: HolderOf once woken = %+v, %v; want the lock released", shard, h, err)
		}
		if d, _, cached := a.Landed(ctx, ev); d == nil || !cached {
			t.Fatalf("shard %d: Landed = %v, cached %v; want the document", shard, d, cached)
		}
		if _, err := b.Invalidate(ctx, id, time.Minute); err != nil {
			t.Fatal(err)
		}
		nextOf(t, w, EventInval)
		a.Unregister(w)
	}
	for i, ps := range plain {
		const mark = "mark"
		if err := rc.Node(i).Client(t).Publish(ctx, a.channel(), mark).Err(); err != nil {
			t.Fatal(err)
		}
		m, err := ps.ReceiveMessage(ctx)
		if err != nil || m.Payload != mark {
			t.Fatalf("node %d: plain channel carried %v, %v before the mark; want nothing", i, m, err)
		}
	}
}
