-- The wrk script of compare_nginx.sh and paired.sh, one load per run
-- (the environment gives MODE, PREFIX and REPLAY_KEYS): forwarding
-- (MODE=off: a new key per request, on the `key = "off"` route), first
-- writes (first: a new key per request) or replays (replay: the keys
-- cycle over REPLAY_KEYS). Keys carry a per-run PREFIX, so no run
-- replays another's keys. A new key starts with 16 random hex digits, as
-- the UUIDs SDKs send do, so that it lands at a random place in the
-- store's identity index: keys from a counter sort next to each other,
-- share a few index pages and understate what a first write costs the
-- disk (by 40 % here). The thread and counter after it keep keys unique
-- whatever the random digits. With BODIES=distinct each request's body
-- names its key (as a client's real orders differ), so that no write is
-- a twin of another under the rotated-key guard. Each run ends with one
-- RESULT line: req/s, p50 and p99 in ms, non-2xx answers, socket errors,
-- requests.
local mode = os.getenv("MODE")
local distinct = os.getenv("BODIES") == "distinct"
local prefix = os.getenv("PREFIX")
local replay_keys = tonumber(os.getenv("REPLAY_KEYS"))
local body = '{"amount":1000,"currency":"eur","description":"bench order","customer":"cus_42"}'
local path = mode == "off" and "/plain/orders" or "/orders"
local threads = 0
local counter = 0
-- `id` is a global each thread gets from setup().

function setup(thread)
    thread:set("id", threads)
    threads = threads + 1
end

function init(args)
    math.randomseed(os.time() * 16 + id)
end

local function random_hex()
    return string.format("%04x%04x%04x%04x", math.random(0, 65535), math.random(0, 65535),
        math.random(0, 65535), math.random(0, 65535))
end

request = function()
    counter = counter + 1
    local key
    if mode == "replay" then
        key = prefix .. "-" .. (counter % replay_keys)
    else
        key = random_hex() .. "-" .. prefix .. "-" .. id .. "-" .. counter
    end
    return wrk.format("POST", path, {
        ["Authorization"] = "Bearer bench",
        ["Idempotency-Key"] = key,
        ["Content-Type"] = "application/json",
    }, distinct and string.format('{"amount":1000,"currency":"eur","description":"%s"}', key)
        or body)
end

done = function(summary, latency, requests)
    local non2xx = summary.errors.status
    local errors = summary.errors.connect + summary.errors.read + summary.errors.write
        + summary.errors.timeout
    io.write(string.format("RESULT %.1f %.3f %.3f %d %d %d\n",
        summary.requests / (summary.duration / 1e6),
        latency:percentile(50) / 1000, latency:percentile(99) / 1000, non2xx, errors,
        summary.requests))
end
