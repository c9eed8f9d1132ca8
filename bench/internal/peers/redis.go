package peers

import (
	"bufio"
	"context"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// DialRedis connects to the Redis server at addr with a pool of poolSize
// connections and checks that it answers.
func DialRedis(ctx context.Context, addr string, poolSize int) (*redis.Client, error) {
	rc := redis.NewClient(&redis.Options{
		Addr: addr, PoolSize: poolSize, MinIdleConns: poolSize,
		DialTimeout: DialTimeout, ReadTimeout: DialTimeout, WriteTimeout: DialTimeout,
		// The bench measures plain commands; no client-side tracking.
		Protocol: 2, DisableIdentity: true,
	})
	ctx, cancel := context.WithTimeout(ctx, DialTimeout)
	defer cancel()
	if err := rc.Ping(ctx).Err(); err != nil {
		rc.Close()
		return nil, fmt.Errorf("redis: %w", err)
	}
	return rc, nil
}

// RedisVersion reads redis_version from INFO server.
func RedisVersion(ctx context.Context, addr string) (string, error) {
	rc, err := DialRedis(ctx, addr, 1)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	info, err := rc.Info(ctx, "server").Result()
	if err != nil {
		return "", fmt.Errorf("redis: %w", err)
	}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "redis_version:"); ok {
			return v, nil
		}
	}
	return "unknown", nil
}
