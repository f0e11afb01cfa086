/* gov.js: subscribe this browser to web push through gov. No dependency; sets window.gov.
 *
 *   button.onclick = () => gov.subscribe({ vapidPublicKey, endpoint: '/subscriptions', token });
 *
 * Call it from a user gesture (a click): browsers refuse the permission prompt otherwise.
 * `token` is a subscribe token your backend mints for the logged-in user
 * (gov.http.tokens.mint_subscribe_token); gov stores the subscription for that user only.
 * Options: `worker` (the script to register, default '/gov-sw.js'; null: use the worker the
 * page already registered, e.g. yours with importScripts('/gov-sw.js')), `events` (where the
 * worker beacons, default /events next to `endpoint`).
 */
(() => {
  'use strict';

  // The same store gov-sw.js reads: IndexedDB 'gov', object store 'kv'.
  function kv(key, value) {
    return new Promise((resolve, reject) => {
      const open = indexedDB.open('gov', 1);
      open.onupgradeneeded = () => open.result.createObjectStore('kv');
      open.onerror = () => reject(open.error);
      open.onsuccess = () => {
        const conn = open.result;
        const tx = conn.transaction('kv', value === undefined ? 'readonly' : 'readwrite');
        const req = value === undefined ? tx.objectStore('kv').get(key)
          : value === null ? tx.objectStore('kv').delete(key) : tx.objectStore('kv').put(value, key);
        tx.oncomplete = () => { conn.close(); resolve(value === undefined ? req.result : value); };
        tx.onerror = () => { conn.close(); reject(tx.error); };
      };
    });
  }

  // base64url text -> bytes: what pushManager.subscribe wants as applicationServerKey
  function bytes(base64url) {
    const b64 = base64url.replace(/-/g, '+').replace(/_/g, '/') + '='.repeat((4 - (base64url.length % 4)) % 4);
    return Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  }

  async function registration(worker) {
    if (!('serviceWorker' in navigator) || !('PushManager' in window)) {
      throw new Error('this browser has no web push (or the page is not served over https)');
    }
    if (worker) await navigator.serviceWorker.register(worker); // the same URL again is a no-op
    return navigator.serviceWorker.ready; // the active registration
  }

  async function subscribe({ vapidPublicKey, endpoint = '/subscriptions', token, worker = '/gov-sw.js', events } = {}) {
    if (!vapidPublicKey || !token) throw new Error('gov.subscribe needs vapidPublicKey and token');
    // Ask first, while the click still counts as a user gesture.
    const permission = await Notification.requestPermission();
    if (permission !== 'granted') throw new Error(`notification permission ${permission}`);
    const reg = await registration(worker);
    // userVisibleOnly: every push shows a notification (gov-sw.js keeps that promise).
    const sub = await reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: bytes(vapidPublicKey) });
    const json = sub.toJSON();
    const answer = await fetch(endpoint, {
      method: 'POST', credentials: 'same-origin', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ token, subscription: json }),
    });
    const body = await answer.json().catch(() => ({}));
    if (!answer.ok) throw new Error(`gov refused the subscription (${answer.status}): ${body.error || ''}`);
    const subscriptions = new URL(endpoint, location.href).href;
    // What the worker needs to beacon for this user and to renew after pushsubscriptionchange.
    await kv('me', {
      userId: body.userId, subscriptionId: body.subscriptionId, subscriptions,
      events: events ? new URL(events, location.href).href : new URL('/events', subscriptions).href,
      vapidPublicKey, endpoint: json.endpoint, auth: json.keys.auth,
    });
    return body; // { subscriptionId, userId }
  }

  // Unsubscribe this browser: the unsubscribe beacon (charged to the last notification shown),
  // gov retires the subscription, the browser drops it.
  async function unsubscribe() {
    const reg = await navigator.serviceWorker.getRegistration();
    const sub = reg && (await reg.pushManager.getSubscription());
    const me = (await kv('me')) || {};
    // { messageId, subscriptionId, token } of the last notification shown (gov-sw.js): the token its
    // push carried is what lets gov take this beacon
    const last = await kv('last');
    if (me.userId && last && last.token) {
      await fetch(me.events, { method: 'POST', headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ userId: me.userId, messageId: last.messageId, event: 'unsubscribe',
          subscriptionId: last.subscriptionId, token: last.token }) })
        .catch(() => {});
    }
    const endpoint = (sub && sub.endpoint) || me.endpoint;
    const auth = (sub && sub.toJSON().keys.auth) || me.auth;
    if (me.subscriptions && endpoint && auth) {
      await fetch(`${me.subscriptions.replace(/\/$/, '')}/retire`, { method: 'POST',
        headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint, auth }) }).catch(() => {});
    }
    if (sub) await sub.unsubscribe();
    await kv('me', null);
    return Boolean(sub);
  }

  window.gov = { subscribe, unsubscribe };
})();
