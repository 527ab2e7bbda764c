package store

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Sharded pub/sub, in Redis Cluster only.
//
// A plain PUBLISH in Redis Cluster is broadcast over the cluster bus to
// every node, so each event costs every node, and the bus saturates long
// before the nodes do. Instead, in cluster mode the ids are spread over
// shardChannels shard channels, `<prefix>events:{<tag>}`, each SSUBSCRIBEd
// by every instance's hub on the node that owns the channel's slot, and an
// event is SPUBLISHed to its id's channel: it reaches that node (and its
// replicas) only.
//
// A script may SPUBLISH only to a channel in the slot of its keys, and an
// id's keys are in the id's own slot, not in its channel's. So in cluster
// mode the scripts publish nothing (they get "" as the channel) and the
// event is SPUBLISHed after the script, in a second round trip: the scripts
// release the lock before returning, so a follower woken by the event
// still finds the lock free and L2 written. If that publish fails, the
// caller treats it as the script's failure (Land's caller hands off with a
// release; Invalidate returns the error), and a follower that never hears
// of it re-checks when its lease timer ends.

// shardChannels is the number of shard channels in cluster mode: enough to
// spread the events of a cluster of up to 16 masters over all of them.
const shardChannels = 16

// shardTags are the hash tags of the shard channels: tag i hashes to a slot
// in [1024i, 1024i+1024), so that, with the slots split evenly in ranges
// (as redis-cli --cluster create does), every master owns about the same
// number of channels. They were found by trying "s<i>.0", "s<i>.1", …; a
// test checks each with CLUSTER KEYSLOT.
var shardTags = [shardChannels]string{
	"s0.10",  // slot 653
	"s1.13",  // slot 1114
	"s2.23",  // slot 2773
	"s3.20",  // slot 3074
	"s4.0",   // slot 4982
	"s5.3",   // slot 5157
	"s6.40",  // slot 6881
	"s7.43",  // slot 7222
	"s8.23",  // slot 8830
	"s9.20",  // slot 9385
	"s10.22", // slot 10507
	"s11.21", // slot 12252
	"s12.2",  // slot 12596
	"s13.1",  // slot 13927
	"s14.41", // slot 14655
	"s15.42", // slot 16360
}

// errSlotMoved reports that the server dropped a shard channel
// subscription because the channel's slot moved to another node.
var errSlotMoved = errors.New("coordinator: shard channel's slot moved")

// shardChannelNames returns the shard channels of prefix, in shard order.
func shardChannelNames(prefix string) []string {
	names := make([]string, shardChannels)
	for i, tag := range shardTags {
		names[i] = prefix + "events:{" + tag + "}"
	}
	return names
}

// shardOf returns the shard of id among n: FNV-1a, which is in the
// standard library and spreads ids evenly; any hash every instance shares
// would do.
func shardOf(id string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % uint32(n))
}

// newShardedHub returns a hub on the shard channels (cluster mode).
func newShardedHub(rdb rediser, channels []string, log *slog.Logger, onInval func(string)) *hub {
	h := &hub{
		channels: channels, log: log, onInval: onInval,
		subscribe: func(ctx context.Context, ch string) *redis.PubSub { return rdb.SSubscribe(ctx, ch) },
		waiters:   make(map[string]map[*Waiter]struct{}),
		ready:     make([]atomic.Bool, len(channels)),
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		// A subscription is routed by go-redis's map of the slots, which
		// it refreshes when a command is redirected (a SSUBSCRIBE is not
		// followed) or once a minute: after a slot moved (or its node
		// failed over) the hub would subscribe at the old owner again and
		// again meanwhile. Reloading is asynchronous, deduplicated and
		// rate-limited by go-redis.
		h.reroute = cc.ReloadState
	}
	return h
}

// newHub builds r's hub: on the shard channels when rdb is a Redis Cluster
// client (which switches r to sharded pub/sub), else on the one channel.
func (r *Redis) newHub(rdb rediser, onInval func(string)) *hub {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		r.shards = shardChannelNames(r.prefix)
		r.reload = cc.ReloadState
		return newShardedHub(rdb, r.shards, r.log, onInval)
	}
	return newHub(rdb, r.channel(), r.log, onInval)
}

// scriptPublish returns the channel and message a script publishes, given
// an event's encoding: the channel and the event, or nothing in cluster
// mode, where announce publishes it (so the message is not sent twice).
func (r *Redis) scriptPublish(payload []byte) (channel string, msg []byte) {
	if r.shards != nil {
		return "", nil
	}
	return r.channel(), payload
}

// announce publishes an event of id, encoded as payload, after a script
// that published nothing (cluster mode: SPUBLISH to id's shard channel);
// otherwise the script did and announce does nothing. Call it inside the
// closure of ifUp or evenIfDown that ran the script, so that a failure counts as
// the script's.
func (r *Redis) announce(ctx context.Context, id string, payload []byte) error {
	if r.shards == nil {
		return nil
	}
	return r.rdb.SPublish(ctx, r.shards[shardOf(id, len(r.shards))], payload).Err()
}
