/* gov-sw.js: gov's service worker. No dependency; works as the site's worker or inside yours.
 *
 *   As the worker:          navigator.serviceWorker.register('/gov-sw.js')   (gov.js does this)
 *   Inside your own worker: importScripts('/gov-sw.js')   (before or after your own listeners)
 *
 * Every push becomes a visible notification, never a silent one: Chromium charges pushes that
 * show nothing against the origin and may stop waking the worker; Firefox unsubscribes after a
 * few. Suppression happens in the governor, never here. The worker reports what the fatigue
 * report reads, to gov's POST /events: display (shown), click, close (dismissed), each with the
 * beacon token its push carried. A push it cannot read still shows a generic notification, and
 * the error goes to POST /events/errors.
 *
 * Where the beacons go and for which user comes from IndexedDB ('gov' / 'kv' / 'me'), which
 * gov.js fills when the page subscribes. Set self.GOV_CONFIG = { fallbackTitle, icon, badge }
 * before importScripts to change the defaults.
 */
(() => {
  'use strict';
  const config = Object.assign(
    { fallbackTitle: 'New notification', icon: undefined, badge: undefined, events: '/events' },
    self.GOV_CONFIG || {},
  );
  const MALFORMED_TAG = 'gov-malformed'; // malformed pushes replace one another instead of piling up

  // ------------------------------------------------------------ IndexedDB: one small key-value store
  function db() {
    return new Promise((resolve, reject) => {
      const open = indexedDB.open('gov', 1);
      open.onupgradeneeded = () => open.result.createObjectStore('kv'); // first use: create the store
      open.onsuccess = () => resolve(open.result);
      open.onerror = () => reject(open.error);
    });
  }
  async function kv(key, value) { // kv(key) reads, kv(key, value) writes; resolves to the value
    const conn = await db();
    try {
      return await new Promise((resolve, reject) => {
        const tx = conn.transaction('kv', value === undefined ? 'readonly' : 'readwrite');
        const req = value === undefined ? tx.objectStore('kv').get(key) : tx.objectStore('kv').put(value, key);
        tx.oncomplete = () => resolve(value === undefined ? req.result : value);
        tx.onerror = () => reject(tx.error);
      });
    } finally {
      conn.close();
    }
  }

  // ------------------------------------------------------------ beacons
  // me = { userId, subscriptionId, events, subscriptions, vapidPublicKey, endpoint, auth } (gov.js)
  async function me() {
    try { return (await kv('me')) || {}; } catch (e) { return {}; } // private mode: no IndexedDB
  }
  async function post(url, body) {
    // text/plain keeps the request "simple" (no CORS preflight); gov reads it as JSON all the same
    try {
      await fetch(url, { method: 'POST', keepalive: true, headers: { 'content-type': 'text/plain' },
        body: JSON.stringify(body) });
    } catch (e) { /* offline: a lost beacon is a lost count, never a lost notification */ }
  }
  // gov takes a beacon only with the token its push carried (data.token, for data.sub, the
  // subscription it came to): an HMAC only this browser could read, since the payload is encrypted
  // to it. So the token and that subscription id are echoed as they came, never the stored ones.
  function delivery(data) {
    if (!data || typeof data.id !== 'string' || typeof data.token !== 'string' || !Number.isInteger(data.sub)) {
      return null;
    }
    return { messageId: data.id, subscriptionId: data.sub, token: data.token };
  }
  // The notification shown last, which gov.unsubscribe() charges: kept by the moment it was
  // shown, read and written in one transaction, so two pushes handled at once (their beacons
  // answered in either order) never leave the older one as the last.
  async function keepLast(one, shownAt) {
    const conn = await db();
    try {
      await new Promise((resolve, reject) => {
        const tx = conn.transaction('kv', 'readwrite');
        const store = tx.objectStore('kv');
        const req = store.get('last');
        req.onsuccess = () => {
          const old = req.result;
          if (!old || !(old.shownAt > shownAt)) store.put(Object.assign({ shownAt }, one), 'last');
        };
        tx.oncomplete = () => resolve();
        tx.onerror = () => reject(tx.error);
      });
    } finally {
      conn.close();
    }
  }
  async function beacon(event, data) {
    const at = performance.timeOrigin + performance.now(); // a display beacon is sent once it is shown
    const who = await me();
    const one = delivery(data);
    if (!who.userId || !one) return; // not subscribed through gov.js, or no token: gov would refuse it
    if (event === 'display') await keepLast(one, at).catch(() => {});
    await post(who.events || config.events, Object.assign({ userId: who.userId, event }, one));
  }
  async function reportError(detail, data, kind = 'payload') {
    const who = await me();
    const body = { kind, detail: String(detail).slice(0, 200) };
    if (data && typeof data.id === 'string') body.messageId = data.id;
    const one = delivery(data);
    if (one && who.userId) Object.assign(body, one, { userId: who.userId }); // where the push had a token
    await post(`${(who.events || config.events).replace(/\/$/, '')}/errors`, body); // /events -> /events/errors
  }

  // ------------------------------------------------------------ push: always a visible notification
  // gov's payload (gov.delivery.push.build_payload):
  // {"title","body","tag","data":{"url","tier","id","sub","token"}} (a summary adds data.count)
  function read(pushData) {
    if (!pushData) throw new Error('push without a payload');
    const msg = pushData.json(); // throws on text that is not JSON
    if (!msg || typeof msg !== 'object') throw new Error('payload is not a JSON object');
    if (typeof msg.title !== 'string' || !msg.title.trim()) throw new Error('payload has no title');
    return msg;
  }
  async function onPush(event) {
    let msg;
    let error = null;
    try {
      msg = read(event.data);
    } catch (e) {
      error = e;
    }
    if (error) {
      // Still a notification: a push that shows nothing costs the origin its push budget.
      let data = {};
      try { const raw = event.data && event.data.json(); if (raw && typeof raw.data === 'object') data = raw.data || {}; }
      catch (e) { /* not JSON at all */ }
      await self.registration.showNotification(config.fallbackTitle,
        { tag: MALFORMED_TAG, icon: config.icon, badge: config.badge, data });
      await Promise.all([reportError(error.message || error, data), beacon('display', data)]);
      return;
    }
    const data = msg.data && typeof msg.data === 'object' ? msg.data : {};
    await self.registration.showNotification(msg.title, {
      body: typeof msg.body === 'string' ? msg.body : '',
      // same tag: replaces, not stacks (gov always sends one; else the message id, as gov's would be)
      tag: typeof msg.tag === 'string' && msg.tag ? msg.tag : (typeof data.id === 'string' && data.id) || undefined,
      icon: msg.icon || config.icon,
      badge: msg.badge || config.badge,
      data, // url, tier and id come back in notificationclick and notificationclose
    });
    await beacon('display', data); // only once it is shown: display means displayed
  }

  // ------------------------------------------------------------ click: count it, then focus or open
  // Where a click goes: the push's url, resolved against the scope, if it is an http(s) URL the
  // browser can read; else the scope (gov refuses other URLs when sending; a payload not from
  // gov must not open javascript:, data: or a URL that throws before the click is counted).
  function clickTarget(url) {
    try {
      const target = new URL(typeof url === 'string' && url ? url : self.registration.scope, self.registration.scope);
      if (target.protocol === 'https:' || target.protocol === 'http:') return target.href;
    } catch (e) { /* not a URL: the scope */ }
    return self.registration.scope;
  }
  async function onClick(event) {
    const data = event.notification.data || {};
    event.notification.close(); // a clicked notification goes away (no close event for it)
    const target = clickTarget(data.url);
    const windows = await self.clients.matchAll({ type: 'window', includeUncontrolled: true });
    const open = windows.find((w) => w.url === target);
    await Promise.all([
      beacon('click', data),
      (open ? open.focus() : self.clients.openWindow(target)).catch(() => {}), // may be refused: still counted
    ]);
  }

  // ------------------------------------------------------------ close: dismissed without a click
  function onClose(event) {
    return beacon('close', event.notification.data || {}); // the early fatigue signal
  }

  // ------------------------------------------------------------ the push service replaced the subscription
  // A renewal that fails (gov refuses the proof, the push service refuses to subscribe) leaves
  // the browser on a subscription gov does not know: reported, not thrown into the void.
  async function onSubscriptionChange(event) {
    try {
      await renew(event);
    } catch (e) {
      await reportError(e && e.message ? e.message : e, {}, 'renewal').catch(() => {});
    }
  }
  async function renew(event) {
    const who = await me();
    const old = event.oldSubscription ? event.oldSubscription.toJSON() : { endpoint: who.endpoint, keys: { auth: who.auth } };
    if (!old.endpoint || !old.keys || !who.subscriptions) return; // never subscribed through gov.js
    const key = (event.oldSubscription && event.oldSubscription.options.applicationServerKey) || who.vapidPublicKey;
    const fresh = event.newSubscription ||
      await self.registration.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: key });
    const json = fresh.toJSON();
    // No token here: the old subscription's endpoint and auth secret (known to this browser and gov
    // only) prove the user; gov stores the new one for the same user and retires the old one.
    const answer = await fetch(who.subscriptions, { method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ subscription: json, previous: { endpoint: old.endpoint, auth: old.keys.auth } }) });
    if (!answer.ok) throw new Error(`gov refused the new subscription: ${answer.status}`);
    const stored = await answer.json();
    await kv('me', Object.assign(who, { subscriptionId: stored.subscriptionId, endpoint: json.endpoint, auth: json.keys.auth }));
  }

  // ------------------------------------------------------------ wiring
  self.addEventListener('push', (e) => e.waitUntil(onPush(e)));
  self.addEventListener('notificationclick', (e) => e.waitUntil(onClick(e)));
  self.addEventListener('notificationclose', (e) => e.waitUntil(onClose(e)));
  self.addEventListener('pushsubscriptionchange', (e) => e.waitUntil(onSubscriptionChange(e)));
  // As the site's worker (not imported into yours, whose lifecycle is yours): take over at once,
  // so that an upgraded gov-sw.js handles the next push.
  if (/\/gov-sw\.js$/.test(self.location.pathname)) {
    self.addEventListener('install', () => self.skipWaiting());
    self.addEventListener('activate', (e) => e.waitUntil(self.clients.claim()));
  }
  self.gov = { onPush, onClick, onClose, onSubscriptionChange, kv, keepLast }; // for your own worker, and for tests
})();
